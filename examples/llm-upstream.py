#!/usr/bin/env python3
"""A stand-in LLM API for examples/llm-gateway.yaml (Python standard library).

POST /v1/chat/completions answers an OpenAI-style stream (text/event-stream,
chunked): a few content events 50 ms apart, then the usage event
{"usage": {"total_tokens": N}} and `data: [DONE]`. N is a made-up count of
the prompt's bytes plus the words sent. POST /v1/embeddings answers JSON with
the usage in the X-Usage-Tokens header.

    python3 examples/llm-upstream.py 3000
"""
import http.server
import json
import sys
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        if self.path == "/v1/embeddings":
            out = json.dumps({"data": [{"embedding": [0.1, 0.2]}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Usage-Tokens", str(len(body) // 4 + 1))
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        words = ["Rate", " limits", " by", " the", " token."]
        for w in words:
            event = {"choices": [{"delta": {"content": w}}]}
            self.chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            time.sleep(0.05)
        usage = {"usage": {"prompt_tokens": len(body), "completion_tokens": len(words),
                           "total_tokens": len(body) + len(words)}}
        self.chunk(b"data: " + json.dumps(usage).encode() + b"\n\n")
        self.chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
