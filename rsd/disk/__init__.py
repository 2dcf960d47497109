"""The disk: the data directory and everything rsd writes into it.

The data directory and its lock (``datadir.py``); the framing shared by journal segments
and snapshots (``logfile.py``, with ``logfile_v1.py`` reading the oldest format);
appending to the journal (``journal.py``) one write and one fsync per batch
(``groupcommit.py``); snapshots, written by a forked child (``snapshots.py``) into files
checked before they are renamed into place (``snapshotfile.py``); recovery, which reads
it all back (``recovery.py``); and the failpoints that prove it survives a crash.
"""
