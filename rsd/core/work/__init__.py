"""Work: the life of an item, a task or a message, from its submit to its forgetting.

How an item lives. The states and the only legal moves between them are one table,
``TRANSITIONS`` in ``run/items.py`` (protocol.md prints it, a test checks they agree);
every change of state goes through ``transition``, and a move not in the table is a bug
in rsd, never a client's doing. The modules here are the parts that move an item, each
at its moment:

- it enters by intake (``core/intake.py``, above this package: a task may join its
  run's group, so intake stands on ``runs`` too). A task is one per (run, key), a
  message's ``work_key`` dedupes sends for a window; a new item is DELAYED while its
  ``not_before`` is ahead, PENDING otherwise, and is handed at once to a consumer parked
  on its queue if one waits. What intake and the others share (the item table, which
  queue a request names, the queue reads) is ``workbook.py``'s.
- it waits for a worker on its queue's ready line (``run/queue.py``, ``run/lanes.py``
  for priorities and fairness keys). A DELAYED item gets one timer; ITEM_DUE makes it
  PENDING (``deliveries.py``), as it ends a retry's backoff. A message sent with a
  debounce key waits out its window DELAYED, and a later send with the key replaces its
  data and moves its due instant, taking a due one back to DELAYED (``debounce.py``).
- it is delivered (``deliveries.py``): RECEIVE takes it under a lease, one worker at a
  time, RUNNING. An item that needs pool slots or quota takes them all at once or waits
  in the line of what it lacks (``blocked.py``), woken only by room in that pool or quota.
  One whose pools and quotas are homed on another shard waits for a grant of that shard
  instead (``grants.py``), journaled before its delivery and ended with it.
- its delivery is settled (``settlement.py``): complete (SUCCEEDED), retry after a
  backoff or release (PENDING again), reject or the last attempt used (FAILED, and a
  dead letter: ``deadletters.py`` is an operator's view of them). A lease that expires
  puts it back on its line. A settlement sent again after a lost reply is answered as the
  first was (``settled.py``), never applied twice.
- it ends once (``endings.py``): one FINISHED record whatever ended it (its worker, a
  cancel from ``tasks.py``, its deadline, its run's cancellation), its result pushed to
  every waiter at once; a task keeps its outcome for the retention window, then a
  tombstone, then is forgotten; a message is forgotten as soon as it ends.
- in between, ``tasks.py`` answers the task's readers: status, result waits (parked, and
  answered by the ending: nothing polls), subscribe, detach, cancel. Mailbox definitions,
  which every run's queue of one name shares, are ``mailboxbook.py``'s.

What is awkward about it: an item's delivery is a lease, so three parts can end it (its
settlement, its item's ending, its run's cancellation) and each goes through
``Deliveries.end_delivery``; and "RUNNING" says nothing of what the worker does, only
that its lease is live. Each move is a journal record applied by the same appliers
recovery replays, so an item's life after a restart is the one it had before.
"""
