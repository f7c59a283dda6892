"""Tools that serve the product but are not part of it: test beds, runners."""
