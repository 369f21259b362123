"""Schedules: jobs that submit themselves on a cron (``POST /v1/schedules``). ``cron``
reads an expression in a time zone; ``commands`` creates, lists, pauses, resumes and
deletes them for a caller; ``firing`` is the background unit that submits each due tick's
job, once per tick whatever restarts or replicas."""
