"""simulator/analytical"""
