//! What the binary tests share: the `upstream` fixture as a child process.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_mcpyard-loadgen");

/// A running fixture (`upstream --listen 127.0.0.1:0` and `extra`), killed on drop.
pub struct Fixture {
    child: Child,
    pub addr: String,
    scheme: &'static str,
}

impl Fixture {
    pub fn start(extra: &[&str]) -> Fixture {
        let mut child = Command::new(BIN)
            .args(["upstream", "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
        let stdout = child.stdout.take().unwrap_or_else(|| panic!("no stdout"));
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap_or_else(|e| panic!("read listening line: {e}"));
        let addr = line
            .strip_prefix("listening ")
            .map(|a| a.trim().to_owned())
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        let scheme = if extra.contains(&"--tls-cert") {
            "https"
        } else {
            "http"
        };
        Fixture {
            child,
            addr,
            scheme,
        }
    }

    pub fn url(&self) -> String {
        format!("{}://{}/mcp", self.scheme, self.addr)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
