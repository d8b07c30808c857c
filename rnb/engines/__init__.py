"""The runner loop, the load generator and the job's ends every engine shares, and one package per engine.

Kept free of imports: every spawned child imports a module below this package first.
"""
