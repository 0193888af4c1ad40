"""Arrival processes shared by the simulator and the load tools: Poisson, bursty, Azure traces, replay.

Below scheduler.sim and loadtest in the layers: both draw their arrivals from here, so that the load a live
test sends and the load a simulation assumes are the same process (times in seconds, deterministic per seed).
``arrivals`` parses ``--trace`` and generates (Poisson, bursty); ``azure_functions`` reads the MAF 2019/2021
traces; ``replay`` replays recorded arrival times.
"""
