#!/usr/bin/env python3
"""chdb-http: enough of ClickHouse's HTTP interface, on loopback, over chDB.

chDB (PyPI `chdb` / `chdb-core`) is the ClickHouse engine in-process, the same code as
clickhouse-local. This server puts the HTTP interface of clickhouse-server in front of one
persistent chDB session, so an HTTP client of ClickHouse (tokenwatch's store backend) can be run
against a current engine where no current clickhouse-server package exists.

Supported (see README.md beside this file for the limits):
  POST (or GET, read-only) on any path; the query from the `query` URL parameter and/or the
  body (`query` + '\n' + body, as the real server concatenates them); INSERT ... FORMAT X with
  the data following the statement (any input format chDB reads: RowBinary, TSV, JSONEachRow,
  Native, ...); INSERT ... VALUES / SELECT inline; `database=`, `default_format=`, `param_*`
  query parameters, any other URL parameter applied as a setting for that request only;
  GET /ping and GET / answer "Ok."; errors as "Code: N. DB::Exception: ... (NAME) (version V)"
  with clickhouse-server's HTTP status for the code and X-ClickHouse-Exception-Code;
  multi-statements refused as the server does; one user `default` with an empty password
  (as the packaged server; --password to set one).

Run:  python3 server.py --listen 127.0.0.1:18123 --data /tmp/chdb-http-data [--log-queries FILE]
Any error not in the server's table (READONLY, CANNOT_READ_ALL_DATA, ...) is a 500, as there.
"""

import argparse
import base64
import gzip
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

try:
    from chdb import session as chdb_session
except ImportError:  # pragma: no cover
    sys.exit("chdb is not installed: python3 -m venv /tmp/chdb-venv && /tmp/chdb-venv/bin/pip install chdb")

# --- clickhouse-server's HTTP status per exception (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp),
# by error name: chDB's messages end with "(NAME)".
_STATUS_BY_NAME = {}
for _name in ("REQUIRED_PASSWORD",):
    _STATUS_BY_NAME[_name] = 401
for _name in ("UNKNOWN_USER", "WRONG_PASSWORD", "AUTHENTICATION_FAILED", "SET_NON_GRANTED_ROLE", "ACCESS_DENIED"):
    _STATUS_BY_NAME[_name] = 403
for _name in (
    "BAD_ARGUMENTS", "CANNOT_COMPILE_REGEXP", "CANNOT_PARSE_TEXT", "CANNOT_PARSE_ESCAPE_SEQUENCE",
    "CANNOT_PARSE_QUOTED_STRING", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME", "CANNOT_PARSE_NUMBER",
    "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING", "CANNOT_PARSE_IPV4", "CANNOT_PARSE_IPV6",
    "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "CANNOT_PARSE_UUID", "DUPLICATE_COLUMN", "ILLEGAL_COLUMN",
    "UNKNOWN_ELEMENT_IN_AST", "UNKNOWN_TYPE_OF_AST_NODE", "THERE_IS_NO_COLUMN", "TOO_DEEP_AST",
    "TOO_BIG_AST", "UNEXPECTED_AST_STRUCTURE", "SYNTAX_ERROR", "INCORRECT_DATA", "TYPE_MISMATCH",
    "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
):
    _STATUS_BY_NAME[_name] = 400
for _name in (
    "UNKNOWN_TABLE", "UNKNOWN_FUNCTION", "UNKNOWN_IDENTIFIER", "UNKNOWN_TYPE", "UNKNOWN_STORAGE",
    "UNKNOWN_DATABASE", "UNKNOWN_SETTING", "UNKNOWN_DIRECTION_OF_SORTING", "UNKNOWN_AGGREGATE_FUNCTION",
    "UNKNOWN_FORMAT", "UNKNOWN_DATABASE_ENGINE", "UNKNOWN_TYPE_OF_QUERY", "UNKNOWN_ROLE",
):
    _STATUS_BY_NAME[_name] = 404
_STATUS_BY_NAME.update({
    "QUERY_IS_TOO_LARGE": 413, "NOT_IMPLEMENTED": 501, "SOCKET_TIMEOUT": 503, "CANNOT_OPEN_FILE": 503,
    "HTTP_LENGTH_REQUIRED": 411, "TIMEOUT_EXCEEDED": 408, "CANNOT_SCHEDULE_TASK": 503,
    "UNSUPPORTED_MEDIA_TYPE": 415,
})

# URL parameters that are not settings (everything else is applied as a setting).
_NOT_SETTINGS = {
    "query", "database", "default_format", "user", "password", "query_id", "session_id",
    "session_timeout", "session_check", "compress", "decompress", "buffer_size", "wait_end_of_query",
    "quota_key", "stacktrace", "role", "client_protocol_version", "close_session",
}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_READ_ONLY_FIRST = {"SELECT", "WITH", "SHOW", "DESC", "DESCRIBE", "EXISTS", "EXPLAIN", "SET", "USE", "("}
_ERR = re.compile(r"Code: (\d+)\. (DB::Exception: .*)", re.S)


class ChError(Exception):
    """An error answered as clickhouse-server would: code, name, message."""

    def __init__(self, code, name, message):
        super().__init__(message)
        self.code, self.name, self.message = code, name, message


def _from_chdb(exc):
    """A ChError from chDB's exception text ("... Code: 60. DB::Exception: ... (UNKNOWN_TABLE) ...")."""
    text = str(exc)
    m = _ERR.search(text)
    if not m:
        return ChError(1001, "STD_EXCEPTION", "DB::Exception: " + text.strip())
    code, msg = int(m.group(1)), m.group(2).strip()
    names = re.findall(r"\(([A-Z][A-Z0-9_]+)\)", msg)
    return ChError(code, names[-1] if names else "", msg)


# --- a small SQL lexer over bytes: enough to find the statement kind, an INSERT's data, the
# output format, and a second statement. Whitespace and comments are skipped.
def _tokens(buf, pos=0):
    n = len(buf)
    while pos < n:
        c = buf[pos]
        if c in b" \t\r\n\f\v":
            pos += 1
        elif buf.startswith(b"--", pos):
            e = buf.find(b"\n", pos)
            pos = n if e < 0 else e + 1
        elif buf.startswith(b"/*", pos):
            e = buf.find(b"*/", pos + 2)
            pos = n if e < 0 else e + 2
        elif c in b"'\"`":
            q, e = c, pos + 1
            while e < n:
                if buf[e] == 0x5C:  # backslash escape
                    e += 2
                elif buf[e] == q:
                    if e + 1 < n and buf[e + 1] == q:  # doubled quote
                        e += 2
                    else:
                        break
                else:
                    e += 1
            end = min(e + 1, n)
            yield ("string" if q == 0x27 else "ident", pos, end)
            pos = end
        elif chr(c).isalnum() or c == 0x5F or c >= 0x80:
            e = pos + 1
            while e < n and (chr(buf[e]).isalnum() or buf[e] == 0x5F or buf[e] >= 0x80):
                e += 1
            yield ("word", pos, e)
            pos = e
        else:
            yield ("punct", pos, pos + 1)
            pos += 1


def _word(buf, tok):
    return buf[tok[1]:tok[2]].decode("utf-8", "replace").upper() if tok[0] == "word" else buf[tok[1]:tok[2]].decode("utf-8", "replace")


class Statement:
    """What one request asks: `sql` (text), and for INSERT ... FORMAT X the `head` to stream into
    with `fmt` and the raw `data` bytes."""

    def __init__(self, kind, sql=None, head=None, fmt=None, data=None, out_format=None):
        self.kind, self.sql, self.head, self.fmt, self.data, self.out_format = kind, sql, head, fmt, data, out_format


def parse_request(buf):
    toks = _tokens(buf)
    first = next(toks, None)
    if first is None:
        raise ChError(62, "SYNTAX_ERROR", "DB::Exception: Empty query. (SYNTAX_ERROR)")
    kind = _word(buf, first)
    if kind == "INSERT":
        depth, prev = 0, None
        for tok in toks:
            w = _word(buf, tok)
            if tok[0] == "punct":
                depth += {"(": 1, ")": -1}.get(w, 0)
            if depth == 0 and prev == "FORMAT" and tok[0] in ("word", "ident"):
                # A ';' right after the format name is refused (ParserInsertQuery looks at the
                # byte just after the name; over HTTP that is the '\n' joining `query` and the
                # body, so binary data starting with 0x3B is data, not a ';').
                d = tok[2]
                if d < len(buf) and buf[d] == 0x3B:
                    raise ChError(62, "SYNTAX_ERROR",
                                  "DB::Exception: You have excessive ';' symbol before data for INSERT. (SYNTAX_ERROR)")
                # Data begins after spaces/tabs and one optional "\r\n" or "\n".
                while d < len(buf) and buf[d] in b" \t\f":
                    d += 1
                if d < len(buf) and buf[d] == 0x0D:
                    d += 1
                if d < len(buf) and buf[d] == 0x0A:
                    d += 1
                head = buf[:fmt_kw_start].decode("utf-8")
                fmt = buf[tok[1]:tok[2]].decode("utf-8", "replace").strip("`\"")
                return Statement("INSERT", head=head.strip(), fmt=fmt, data=buf[d:])
            if depth == 0 and tok[0] == "word" and w in ("VALUES", "SELECT", "WITH"):
                break  # inline data or INSERT SELECT: the whole thing is SQL text
            if tok[0] == "word" and w == "FORMAT":
                fmt_kw_start = tok[1]
            prev = w if tok[0] == "word" else None
    # Any other statement: one statement of text; a second one is refused, as the server does.
    try:
        sql = buf.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ChError(6, "CANNOT_PARSE_TEXT", f"DB::Exception: Query is not valid UTF-8 at byte {e.start}. (CANNOT_PARSE_TEXT)")
    out_format, prev, semicolon = None, None, None
    depth = 0
    for tok in _tokens(buf):
        w = _word(buf, tok)
        if semicolon is not None:
            raise ChError(62, "SYNTAX_ERROR",
                          f"DB::Exception: Syntax error (Multi-statements are not allowed): failed at position "
                          f"{semicolon + 1} (end of query): {sql[semicolon:semicolon + 40]!r}. (SYNTAX_ERROR)")
        if tok[0] == "punct":
            depth += {"(": 1, ")": -1}.get(w, 0)
            if w == ";":
                semicolon = tok[1]
        if depth == 0 and prev == "FORMAT" and tok[0] in ("word", "ident"):
            out_format = buf[tok[1]:tok[2]].decode("utf-8", "replace").strip("`\"")
        prev = w if tok[0] == "word" else None
    if semicolon is not None:
        sql = sql[:semicolon]
    return Statement(kind, sql=sql, out_format=out_format)


def content_type(fmt):
    f = (fmt or "").lower()
    if f.startswith(("tabseparated", "tsv")):
        return "text/tab-separated-values; charset=UTF-8"
    if f.startswith("csv"):
        return "text/csv; charset=UTF-8; header=absent"
    if f in ("jsoneachrow", "jsonstringseachrow", "jsoncompacteachrow", "ndjson", "jsonlines"):
        return "application/x-ndjson; charset=UTF-8"
    if f.startswith("json"):
        return "application/json; charset=UTF-8"
    if f.startswith(("pretty", "vertical", "markdown")):
        return "text/plain; charset=UTF-8"
    return "application/octet-stream"


class Engine:
    """One chDB session; every request runs under the lock (current database, per-request
    settings, the statement, the settings put back)."""

    # Session settings set at start, where chDB (clickhouse-local) differs from clickhouse-server:
    # local turns on `implicit_select` (a bare `1+1` is a query), and chDB 26.9 reports
    # async_insert = 1 and mutations_sync = 1 where the server has long answered inserts
    # synchronously and run mutations in the background. --setting adds or overrides.
    SERVER_LIKE = [("implicit_select", "0"), ("async_insert", "0"), ("mutations_sync", "0")]

    def __init__(self, path, startup_settings=()):
        self.path = path
        self.session = chdb_session.Session(path)
        self.lock = threading.Lock()
        for k, v in list(self.SERVER_LIKE) + list(startup_settings):
            self._q(f"SET {k} = {_lit(v)}")
        self.version = self.session.query("SELECT version()", "TSV").bytes().decode().strip()

    def close(self):
        with self.lock:
            self.session.close()

    def _q(self, sql, fmt="TSV", params=None):
        try:
            return self.session.query(sql, fmt, params=params or None)
        except Exception as e:  # ChdbError / RuntimeError
            raise _from_chdb(e)

    def run(self, st, database, settings, params, default_format):
        with self.lock:
            self._q(f"USE {database}" if database else "USE default")
            saved = []
            try:
                for k, v in settings:
                    before = self._q(f"SELECT value, changed FROM system.settings WHERE name = {_lit(k)}").bytes().decode()
                    if not before:
                        raise ChError(115, "UNKNOWN_SETTING", f"DB::Exception: Unknown setting '{k}'. (UNKNOWN_SETTING)")
                    value, changed = before.rstrip("\n").split("\t")[:2]
                    self._q(f"SET {k} = {_lit(v)}")
                    saved.append((k, value if changed == "1" else None))
                if st.kind == "INSERT" and st.head is not None:
                    try:
                        with self.session.send_insert(st.head, st.fmt) as ins:
                            if st.data:
                                ins.append(st.data)
                            res = ins.finish()
                    except ChError:
                        raise
                    except Exception as e:
                        raise _from_chdb(e)
                    return b"", {"written_rows": res.rows_written, "written_bytes": res.bytes_written,
                                 "elapsed_ns": int(res.elapsed * 1e9)}, None
                r = self._q(st.sql, default_format, params)
                out = r.bytes() if r is not None else b""
                return out, {"read_rows": r.rows_read(), "read_bytes": r.bytes_read(),
                             "written_rows": r.rows_written(), "elapsed_ns": int(r.elapsed() * 1e9)}, \
                    st.out_format or default_format
            finally:
                for k, value in reversed(saved):
                    try:
                        self._q(f"SET {k} = DEFAULT" if value is None else f"SET {k} = {_lit(value)}")
                    except ChError as e:
                        print(f"chdb-http: could not restore setting {k}: {e.message}", file=sys.stderr)


def _lit(s):
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "chdb-http"
    timeout = 30  # idle keep-alive connections are closed after this (the server's default)
    disable_nagle_algorithm = True  # else headers and body wait on delayed ACKs (~40 ms a request)

    def log_message(self, fmt, *args):  # quiet by default
        if self.server.cfg.verbose:
            sys.stderr.write("chdb-http: %s - %s\n" % (self.address_string(), fmt % args))

    # --- plumbing
    def _send(self, status, body, headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-ClickHouse-Server-Display-Name", "chdb-http")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, e, query_id):
        status = _STATUS_BY_NAME.get(e.name, 500)
        msg = e.message
        if "(version " not in msg:
            msg += f" (version {self.server.engine.version} (chdb-http))"
        body = f"Code: {e.code}. {msg}\n".encode()
        self._send(status, body, [("Content-Type", "text/plain; charset=UTF-8"),
                                  ("X-ClickHouse-Exception-Code", str(e.code)),
                                  ("X-ClickHouse-Query-Id", query_id)])
        return status

    def _body(self):
        te = self.headers.get("Transfer-Encoding", "").lower()
        if "chunked" in te:
            parts = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline(3)
            body = b"".join(parts)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        enc = self.headers.get("Content-Encoding", "").lower().strip()
        if enc in ("gzip", "x-gzip"):
            body = gzip.decompress(body)
        elif enc == "deflate":
            body = zlib.decompress(body)
        elif enc not in ("", "identity"):
            raise ChError(353, "UNKNOWN_COMPRESSION_METHOD",
                          f"DB::Exception: Unknown HTTP compression method {enc!r} (chdb-http: gzip and deflate only). (UNKNOWN_COMPRESSION_METHOD)")
        return body

    def _auth(self, params):
        """(accepted, the user the request names)."""
        want = self.server.cfg.password
        user, pw = params.get("user"), params.get("password")
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("basic "):
            try:
                user, _, pw = base64.b64decode(auth[6:].strip()).decode().partition(":")
            except Exception:
                return False, "default"
        user = self.headers.get("X-ClickHouse-User", user) or "default"
        pw = self.headers.get("X-ClickHouse-Key", pw) or ""
        if want is None:  # --any-password
            return True, user
        return user == self.server.cfg.user and pw == want, user

    # --- requests
    def do_GET(self):
        self._handle(read_only=True)

    def do_POST(self):
        self._handle(read_only=False)

    def do_HEAD(self):
        self._send(200, b"", [("Content-Type", "text/plain; charset=UTF-8")])

    def _handle(self, read_only):
        started = time.monotonic()
        url = urlsplit(self.path)
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        status, logged, note = 200, "", ""
        try:
            body = b"" if read_only else self._body()
            if url.path in ("/ping", "/replicas_status") or (read_only and "query" not in params and not body):
                self._send(200, b"Ok.\n", [("Content-Type", "text/html; charset=UTF-8")])
                return
            accepted, user = self._auth(params)
            if not accepted:
                raise ChError(516, "AUTHENTICATION_FAILED",
                              f"DB::Exception: {user}: Authentication failed: password is incorrect, "
                              "or there is no user with such name. (AUTHENTICATION_FAILED)")
            q = params.get("query")
            buf = ((q.encode() + b"\n") if q else b"") + body
            st = parse_request(buf)
            logged = st.sql if st.sql is not None else f"{st.head} FORMAT {st.fmt} <{len(st.data)} bytes>"
            if read_only and st.kind not in _READ_ONLY_FIRST:
                raise ChError(164, "READONLY",
                              "DB::Exception: Cannot execute query in readonly mode. For queries over HTTP, method GET "
                              "implies readonly. You should use method POST for modifying queries. (READONLY)")
            database = params.get("database") or ""
            if database and not _IDENT.match(database):
                database = "`" + database.replace("`", "\\`") + "`"
            settings = [(k, v) for k, v in params.items() if k not in _NOT_SETTINGS and not k.startswith("param_")]
            for k, _ in settings:
                if not _IDENT.match(k):
                    raise ChError(115, "UNKNOWN_SETTING", f"DB::Exception: Unknown setting '{k}'. (UNKNOWN_SETTING)")
            qparams = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
            default_format = params.get("default_format") or "TabSeparated"
            out, summary, fmt = self.server.engine.run(st, database, settings, qparams, default_format)
            summary["result_bytes"] = len(out)
            headers = [("Content-Type", content_type(fmt) if fmt else "text/plain; charset=UTF-8"),
                       ("X-ClickHouse-Query-Id", query_id),
                       ("X-ClickHouse-Summary", json.dumps({k: str(v) for k, v in summary.items()}))]
            if fmt:
                headers.append(("X-ClickHouse-Format", fmt))
            self._send(200, out, headers)
            note = f"{len(out)} bytes out" if st.kind != "INSERT" else f"{summary.get('written_rows', '?')} rows in"
        except ChError as e:
            status = self._error(e, query_id)
            note = f"Code: {e.code}. {e.message}"
        except (ValueError, OSError, zlib.error) as e:
            status = self._error(ChError(1001, "STD_EXCEPTION", f"DB::Exception: {e}"), query_id)
            note = str(e)
        finally:
            self.server.log_query(self.command, params.get("database", ""), logged, status, note,
                                  time.monotonic() - started)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, cfg, engine):
        super().__init__(addr, Handler)
        self.cfg, self.engine = cfg, engine
        self._log_lock = threading.Lock()
        self._log = open(cfg.log_queries, "a", buffering=1) if cfg.log_queries else None

    def log_query(self, method, database, sql, status, note, secs):
        if self._log is None and not self.cfg.verbose:
            return
        rec = {"t": round(time.time(), 3), "method": method, "database": database, "status": status,
               "ms": round(secs * 1000, 1), "sql": sql[:4000], "note": note[:2000]}
        line = json.dumps(rec, ensure_ascii=False)
        with self._log_lock:
            if self._log:
                self._log.write(line + "\n")
            if self.cfg.verbose:
                sys.stderr.write(line + "\n")


def main():
    ap = argparse.ArgumentParser(description="ClickHouse HTTP interface over chDB, loopback only")
    ap.add_argument("--listen", default="127.0.0.1:18123", help="loopback HOST:PORT (default 127.0.0.1:18123)")
    ap.add_argument("--data", default="/tmp/chdb-http-data", help="chDB data directory (kept across restarts)")
    ap.add_argument("--reset", action="store_true", help="delete the data directory first")
    ap.add_argument("--user", default="default", help="the one user (default: default)")
    ap.add_argument("--password", default="",
                    help="its password (default empty, as the packaged `default` user); checked from Basic auth, "
                         "X-ClickHouse-User/Key or ?user=&password=; a wrong one gets Code 516, 403")
    ap.add_argument("--any-password", action="store_true", help="accept any user and password")
    ap.add_argument("--log-queries", default=None, help="append one JSON line per request to this file")
    ap.add_argument("--verbose", action="store_true", help="log requests to stderr")
    ap.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                    help="a session setting applied at start (repeatable), e.g. --setting async_insert=1")
    cfg = ap.parse_args()
    if cfg.any_password:
        cfg.password = None
    host, _, port = cfg.listen.rpartition(":")
    host = host.strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("127."):
        sys.exit(f"chdb-http: refusing to listen on {host!r}: loopback addresses only")
    if cfg.reset and os.path.isdir(cfg.data):
        shutil.rmtree(cfg.data)
    os.makedirs(cfg.data, exist_ok=True)
    startup = []
    for item in cfg.setting:
        k, sep, v = item.partition("=")
        if not sep or not _IDENT.match(k.strip()):
            sys.exit(f"chdb-http: --setting {item!r}: expected NAME=VALUE")
        startup.append((k.strip(), v.strip()))
    engine = Engine(cfg.data, startup)
    srv = Server((host, int(port)), cfg, engine)

    def stop(*_):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"chdb-http: ClickHouse {engine.version} (chDB) on http://{host}:{srv.server_address[1]} data {cfg.data}",
          file=sys.stderr, flush=True)
    try:
        srv.serve_forever(poll_interval=0.5)
    finally:
        srv.server_close()
        engine.close()
        print("chdb-http: stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
