"""The HTTP API (FastAPI): the workflow-start API, its review console and its metrics.

app.py          the application: routers, middleware (auth, limits, metrics), problems, the console's static files
appstate.py     what the app holds while it runs (`ApiState`: store, service, rate limits, ...), built by its lifespan
edge.py         what every request must be before any route reads it (Host, size, NUL), refusals charged to the
                address, and which proxies' X-Forwarded-For is believed
service.py      the submission service: agent check, policy and the repository (crewwork/repos/submission.py), then
                stores the item and starts/updates/cancels its workflow
work_items.py, hotfix.py, repositories.py, webhooks.py, bundles.py, replays.py, admin.py   one router
                per resource
streams.py      live events (Server-Sent Events), read up to the safe event id of horizon.py
schemas.py      response models, built from the store's views
problems.py     errors as HTTP problems with one shape
deps.py, ratelimit.py, bodies.py   typed dependencies (the app's state and its parts, the authenticated principal),
                rate limits and strict request bodies
"""
