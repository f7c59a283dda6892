"""Starting clusters: ipcluster launchers and ``Cluster`` (``launcher``), and
tree planning from the command line (``tree``). Runs in the user's process
(or ipcluster's); imports anything below it."""
