"""Emulated boards for testing RPC without hardware (see ``emulated_board.py``)."""
