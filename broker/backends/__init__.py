"""broker/backends"""
