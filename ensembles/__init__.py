"""ensembles"""
