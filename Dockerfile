# The crewwork image: one image for the API, every worker pool and the migration step (the command picks the role):
#   docker run IMAGE api | worker --pool control|agent|validate | db upgrade | config
#
# Stage 1 builds crewwork's wheel and a virtualenv with the pinned dependencies (deploy/requirements.txt);
# stage 2 is a slim Python with git and bubblewrap, the venv copied in, running as an unprivileged user.
# No secret is baked in: every setting comes from CREWWORK_* environment variables at run time.
# deploy/smoke-image.sh builds it and checks it against real PostgreSQL and Temporal.
#
# Pin the base by digest in your registry mirror for reproducible builds, e.g.
#   docker build --build-arg PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:<digest> -t crewwork .
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/crewwork
COPY deploy/requirements.txt /src/requirements.txt
RUN /opt/crewwork/bin/pip install --no-deps --require-hashes -r /src/requirements.txt
COPY pyproject.toml README.md /src/
COPY crewwork /src/crewwork
# The wheel is built in isolation (setuptools from the index), then installed without resolving again:
# the venv holds exactly the pinned set.
RUN /opt/crewwork/bin/pip wheel --no-deps -w /wheels /src \
    && /opt/crewwork/bin/pip install --no-deps /wheels/crewwork-*.whl \
    && /opt/crewwork/bin/pip uninstall -y pip \
    && /opt/crewwork/bin/python -m compileall -q -j 0 /opt/crewwork/lib
# Bytecode is compiled at build time: containers run with a read-only root and start without recompiling.

FROM ${PYTHON_IMAGE} AS runtime
# git: worktrees and landing; bubblewrap: the daemonless sandbox backend; tini: forwards SIGTERM so pools drain.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git bubblewrap tini ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 crewwork \
    && useradd --system --uid 10001 --gid crewwork --home-dir /var/lib/crewwork --create-home \
        --shell /usr/sbin/nologin crewwork
COPY --from=build /opt/crewwork /opt/crewwork
ENV PATH=/opt/crewwork/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CREWWORK_DATA_DIR=/var/lib/crewwork \
    CREWWORK_API_HOST=0.0.0.0 \
    CREWWORK_API_FORWARDED_ALLOW_IPS=
# No X-Forwarded-For is believed unless the operator names the proxy (CREWWORK_API_FORWARDED_ALLOW_IPS): uvicorn's
# own default would trust any client on the container's loopback.
USER 10001:10001
WORKDIR /var/lib/crewwork
EXPOSE 8080
ENTRYPOINT ["/usr/bin/tini", "--", "crewwork"]
CMD ["api"]
