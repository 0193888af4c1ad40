"""scheduler/server"""
