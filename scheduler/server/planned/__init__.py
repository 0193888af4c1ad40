"""The planned service: every model of one manifest, served by the core's driver loop on the event loop's clock.

``service.py`` owns the life cycle (connect, calibrate, step the driver, close); ``executor.py`` runs a dispatched
batch: stacks its rows' inputs, sends each stage call to its vGPU's tritonserver, hands boundary tensors on
through shared memory, and reports each stage's outcome to the driver. Also: the Triton fleet and its health,
calibration, client calls and their answers, applications, request checks, the shm pool and the batch log.
"""
