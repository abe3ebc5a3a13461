"""`ccld alert`: deliver verdicts to Alertmanager and/or a webhook until Ctrl-C (``ccld.sinks.alerts``)."""

from __future__ import annotations

import argparse

from ccld.cli import stop_on_signals
from ccld.errors import BrokerError
from ccld.metrics_http import serving_metrics
from ccld.settings import Settings
from ccld.sinks.alerts import AlertService
from ccld.sinks.sink_metrics import alert_families


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Deliver each incident on the verdicts topic to Alertmanager (v2 API) and/or a JSON "
                          "webhook; offsets are committed only after the receiver answered 2xx.")
    parser.add_argument("--alertmanager", metavar="URL",
                        help="Alertmanager base URL, e.g. http://127.0.0.1:9093 (default: alert_alertmanager_url)")
    parser.add_argument("--webhook", metavar="URL",
                        help="POST each verdict as JSON to this URL (default: alert_webhook_url)")
    parser.add_argument("--slack", action="store_true", default=None,
                        help='the webhook is a Slack incoming webhook: send {"text": ...} (default: alert_slack)')
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on this port, 0: off (default: alert_metrics_port, 9465)")


def main(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.bootstrap:
        raise BrokerError("ccld alert needs --bootstrap (or CCLD_BOOTSTRAP)")
    # the flags win over the CCLD_ALERT_* settings; given as settings, `ccld up` can start the service too
    flags = {"alert_alertmanager_url": args.alertmanager, "alert_webhook_url": args.webhook, "alert_slack": args.slack,
             "alert_metrics_port": args.metrics_port}
    settings = settings.replace(**{k: v for k, v in flags.items() if v is not None})
    service = AlertService(settings)  # refuses to start without a receiver
    from ccld.topics import ensure_topics

    ensure_topics(settings)
    stop = stop_on_signals()
    targets = ", ".join(f"{r.name} {r.target.shown}" for r in service.receivers)
    with serving_metrics(lambda: alert_families(service), settings.metrics_bind, settings.alert_metrics_port,
                         what="alert bridge") as server:
        print(f"alerting: {service.topic} (group {settings.alert_group}) to {targets}", flush=True)
        if server is not None:
            print(f"metrics: {server.url}", flush=True)
        service.run(stop)
    print(f"alert stopped: {service.final_line}", flush=True)
    return 0
