"""model_repository_gen"""
