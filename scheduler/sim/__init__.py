"""scheduler/sim"""
