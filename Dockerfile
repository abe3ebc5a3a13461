# The CCL-D image: the `ccld` CLI with the worker, the sink and the topic tool.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ccld ccld
COPY schemas schemas
COPY probe probe
COPY producers producers
COPY streams streams
COPY sinks sinks
COPY stack stack
RUN pip install --no-cache-dir . && rm -rf /src && useradd --create-home ccld \
    && mkdir /archive && chown ccld /archive  # the sink's volume mounts here and must be writable
USER ccld
WORKDIR /home/ccld
ENTRYPOINT []
CMD ["ccld", "--help"]
