"""Who may connect, and as whom: tokens, authentication, TLS, and the counting of
failed HELLOs (``ratelimit.py``). Nothing here knows a connection; the wire asks it.
"""
