"""TVM benchmark records (schema v0.1, :mod:`.v01`) and their import/export (:mod:`.interchange`).
"""
