//! `mcpyard-loadgen`: load for an MCP Streamable HTTP endpoint.
//!
//! This first mode is closed-loop: `--connections N` keep-alive connections share one MCP
//! session and each sends `tools/call` back to back for `--seconds S` (after a warm-up
//! second that is not recorded), recording each request's latency in an HDR histogram.
//! It reuses mcpyard's own sans-IO HTTP decoder. The open-loop constant-rate mode, the
//! MCP scenarios and the reports are tracked in issue #4.
//!
//! ```text
//! mcpyard-loadgen --url http://127.0.0.1:7114/mcp --connections 8 --seconds 10 \
//!     --tool echo --args '{"text":"hi"}'
//! ```

use bytes::BytesMut;
use hdrhistogram::Histogram;
use mcpyard::http::{ResponseDecoder, ResponseEvent};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Largest response accepted.
const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Socket timeout: a target silent for this long fails the run.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Unrecorded warm-up at the start of every connection.
const WARMUP: Duration = Duration::from_secs(1);

struct Args {
    host: String,
    path: String,
    connections: usize,
    seconds: u64,
    tool: String,
    args: String,
}

fn parse_args() -> Result<Args, String> {
    let mut url = None;
    let mut a = Args {
        host: String::new(),
        path: String::new(),
        connections: 4,
        seconds: 5,
        tool: "echo".into(),
        args: r#"{"text":"hello"}"#.into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => url = Some(value()?),
            "--connections" => {
                a.connections = value()?
                    .parse()
                    .map_err(|e| format!("--connections: {e}"))?
            }
            "--seconds" => a.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--tool" => a.tool = value()?,
            "--args" => a.args = value()?,
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let url = url.ok_or("--url is required")?;
    let rest = url
        .strip_prefix("http://")
        .ok_or("--url must start with http://")?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    a.host = host.to_owned();
    a.path = path;
    if a.connections == 0 || a.seconds == 0 {
        return Err("--connections and --seconds must be positive".into());
    }
    Ok(a)
}

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    fn open(host: &str) -> Result<Conn, String> {
        let stream =
            TcpStream::connect(host).map_err(|e| format!("cannot connect to {host}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
        })
    }

    /// Sends one POST and returns (status, session id header, body).
    fn post(
        &mut self,
        a: &Args,
        session: Option<&str>,
        body: &str,
    ) -> Result<(u16, Option<String>, Vec<u8>), String> {
        let mut req = format!(
            "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\n",
            a.path,
            a.host,
            body.len()
        );
        if let Some(s) = session {
            req.push_str(&format!(
                "mcp-session-id: {s}\r\nmcp-protocol-version: 2025-11-25\r\n"
            ));
        }
        req.push_str("\r\n");
        req.push_str(body);
        self.stream
            .write_all(req.as_bytes())
            .map_err(|e| format!("write: {e}"))?;
        let mut decoder = ResponseDecoder::new(RESPONSE_BYTES_MAX);
        let (mut status, mut sid, mut out) = (0, None, Vec::new());
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match decoder
                .decode(&mut self.buf, false)
                .map_err(|e| format!("bad response: {e}"))?
            {
                Some(ResponseEvent::Head(h)) => {
                    status = h.status;
                    sid = h
                        .headers
                        .get("mcp-session-id")
                        .map(|v| String::from_utf8_lossy(v).into_owned());
                }
                Some(ResponseEvent::Data(d)) => out.extend_from_slice(&d),
                Some(ResponseEvent::End) => return Ok((status, sid, out)),
                None => {
                    let n = self
                        .stream
                        .read(&mut chunk)
                        .map_err(|e| format!("read: {e}"))?;
                    if n == 0 {
                        return Err("the target closed the connection".into());
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                }
            }
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap_or_else(|_| unreachable!("constant bounds"))
}

fn run(a: &Args) -> Result<(), String> {
    let mut first = Conn::open(&a.host)?;
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"mcpyard-loadgen","version":"0.1.0"}}}"#;
    let (status, sid, _) = first.post(a, None, init)?;
    let sid = match (status, sid) {
        (200, Some(s)) => s,
        (s, _) => {
            return Err(format!(
                "initialize answered {s} without a session id: is {} an MCP endpoint?",
                a.path
            ));
        }
    };
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":{},"arguments":{}}}}}"#,
        json_string(&a.tool),
        a.args
    );
    let end = Instant::now() + WARMUP + Duration::from_secs(a.seconds);
    let workers: Vec<_> = (0..a.connections)
        .map(|_| {
            let (host, sid, body) = (a.host.clone(), sid.clone(), body.clone());
            let args = Args {
                host: a.host.clone(),
                path: a.path.clone(),
                connections: 1,
                seconds: a.seconds,
                tool: a.tool.clone(),
                args: a.args.clone(),
            };
            std::thread::spawn(move || -> Result<(Histogram<u64>, u64), String> {
                let mut conn = Conn::open(&host)?;
                let (mut h, mut errors) = (histogram(), 0u64);
                let warm_until = Instant::now() + WARMUP;
                while Instant::now() < end {
                    let start = Instant::now();
                    let (status, _, out) = conn.post(&args, Some(&sid), &body)?;
                    let ok = status == 200 && out.windows(9).any(|w| w == b"\"result\":");
                    if start >= warm_until {
                        if ok {
                            h.saturating_record(start.elapsed().as_micros().max(1) as u64);
                        } else {
                            errors += 1;
                        }
                    }
                }
                Ok((h, errors))
            })
        })
        .collect();
    let (mut all, mut errors) = (histogram(), 0);
    for w in workers {
        let (h, e) = w
            .join()
            .map_err(|_| "a connection thread panicked".to_owned())??;
        all.add(&h).map_err(|e| e.to_string())?;
        errors += e;
    }
    let secs = a.seconds as f64;
    println!(
        "mcpyard-loadgen closed-loop: {} connections, {} s (+1 s warm-up), tools/call {}",
        a.connections, a.seconds, a.tool
    );
    println!(
        "requests {:>10}   errors {errors}   throughput {:.0} req/s",
        all.len(),
        all.len() as f64 / secs
    );
    for (label, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)] {
        println!("{label:>6} {:>10} us", all.value_at_quantile(q));
    }
    println!("{:>6} {:>10} us", "max", all.max());
    if all.is_empty() {
        return Err("no successful request was recorded".into());
    }
    Ok(())
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("mcpyard-loadgen: {e}");
            }
            eprintln!(
                "usage: mcpyard-loadgen --url http://HOST:PORT/PATH [--connections N] [--seconds S] [--tool NAME] [--args JSON]"
            );
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcpyard-loadgen: {e}");
            ExitCode::from(1)
        }
    }
}
