"""A tiny weather web service: the `http` kind's example in docs/tools.md (standard library only).

    WEATHER_API_KEY=... python examples/tools/weather_service.py --port 8808

GET /weather?city=Paris with header X-Api-Key: $WEATHER_API_KEY -> {"city": "Paris", "temp_c": 18.5, ...}
"""
from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

FORECASTS = {"paris": (18.5, "cloudy"), "tokyo": (22.0, "sunny"), "lima": (16.0, "fog")}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):   # noqa: N802 - http.server's name
        url = urlparse(self.path)
        key = os.environ.get("WEATHER_API_KEY")
        if key and self.headers.get("X-Api-Key") != key:
            return self._send(401, {"error": "wrong or missing X-Api-Key"})
        if url.path != "/weather":
            return self._send(404, {"error": f"no such path {url.path}"})
        city = (parse_qs(url.query).get("city") or [""])[0]
        if city.lower() not in FORECASTS:
            return self._send(404, {"error": f"no forecast for {city!r}", "cities": sorted(FORECASTS)})
        temp, sky = FORECASTS[city.lower()]
        return self._send(200, {"city": city, "temp_c": temp, "sky": sky})

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):   # quiet
        pass


def serve(port: int = 8808, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    return ThreadingHTTPServer((host, port), Handler)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8808)
    args = parser.parse_args()
    server = serve(args.port)
    print(f"weather service on http://127.0.0.1:{server.server_port}/weather", flush=True)
    server.serve_forever()
