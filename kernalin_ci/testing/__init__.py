"""Test helpers that other packages' tests import (the GitHub stand-in server, webhook payloads).

Nothing here is used by kernalin-ci at run time.
"""
