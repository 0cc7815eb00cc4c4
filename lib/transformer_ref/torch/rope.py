__all__ = []  # filled in by the module author
