"""The runner loop, the load generator and the job's ends every engine shares, one package per engine, and the
registry that declares them (rnb.engines.registry).

Kept free of imports: every spawned child imports a module below this package first.
"""
