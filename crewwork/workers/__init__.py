"""Worker pools: one process per pool (`crewwork worker --pool NAME`), each polling its own task queue.

pools.py      building and running a pool's worker (its activities from crewwork/steps/registry.py, its concurrency)
slots.py      the pools' slot suppliers (how many activities a process runs at once)
schedules.py  the Temporal Schedule of the retention workflow, kept by the control pools
"""
