"""From a config file to a planned pipeline: everything checked and decided before a process starts."""
