"""workloads/models"""
