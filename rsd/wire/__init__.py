"""The wire: one client connection from its bytes to its replies.

A connection (``connection.py``) reads frames, the batch runner (``batches.py``) applies
them to the core within the server-wide turn budget (``turns.py``), and the output path
(``output.py``) writes each loop turn's replies once per connection, under the budget for
bytes held for clients (``clientbudget.py``). Beside them: the ops the server answers
itself (``session.py``), refused HELLOs (``refusals.py``), the core's one timer
(``coretimer.py``), and the primary's feeds to its standbys (``feeds.py``), which are a
connection's second output: the session and the output path hold them.
"""
