"""Scheduling: who runs next and where. Admission's plan over the queue (``admission.py``,
pure), the queue's SQL (``queue.py``), the monitor's unit that applies the plan each tick
(``queue_keeper.py``), whether a job's workers can ever be placed (``node_fit.py``), fair
share's order and preemption choice (``fair_share.py``, pure), taking borrowed room back
(``preemption.py``), an elastic job's granted size (``elastic_grant.py``) and the driver's
local ranks (``rank_plan.py``).
Imports the store, the stored shapes, job files, quotas, the lifecycle, the event log and
the settings; never the HTTP side nor the module that talks to Ray."""
