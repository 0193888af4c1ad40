"""scheduler/core"""
