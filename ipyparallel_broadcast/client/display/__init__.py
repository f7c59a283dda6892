"""What the client shows: grouped outputs and errors (``grouping``), HTML
reprs (``reprs``) and call timelines (``trace``). Imports ``wire`` only."""
