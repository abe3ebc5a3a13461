"""producers"""
