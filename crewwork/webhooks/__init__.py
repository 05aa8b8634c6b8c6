"""Webhook delivery: the deliverer that sends the outbox's due rows (`deliver`) and the signatures it puts on them
(`signing`). The registrations and the outbox itself are the store's (crewwork/store/outbox.py); where a delivery may
connect is crewwork/boundary/outbound.py."""
