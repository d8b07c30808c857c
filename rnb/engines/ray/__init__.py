"""The Ray engine: the same job as actors on a Ray cluster (driver.py); imported only for --engine ray."""
