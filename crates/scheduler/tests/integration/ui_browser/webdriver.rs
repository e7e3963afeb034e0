//! The few W3C WebDriver calls the map's browser test needs (new session, navigate, run a
//! script, screenshot, end), over plain HTTP/1.1 to a local chromedriver: five JSON calls
//! need no client crate.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Chromium and chromedriver, when both are installed (`.ci/run` installs Debian's).
pub fn browsers() -> Option<(String, String)> {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let driver = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    (std::path::Path::new(&chromium).exists() && std::path::Path::new(&driver).exists())
        .then_some((chromium, driver))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> std::io::Result<Value> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    // Read the head, then exactly Content-Length bytes (chromedriver keeps the
    // connection open whatever the request says).
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let head_end = loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::other("connection closed before the answer"));
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .ok_or_else(|| std::io::Error::other(format!("no content-length in {head:?}")))?;
    while raw.len() < head_end + length {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    let payload = String::from_utf8_lossy(&raw[head_end..]).to_string();
    serde_json::from_str(&payload).map_err(std::io::Error::other)
}

/// A chromedriver process and one headless Chromium session; both end on drop.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    /// Chromium's profile, removed with the browser.
    _profile: tempfile::TempDir,
}

impl Browser {
    pub fn start(chromium: &str, chromedriver: &str) -> Browser {
        let port = free_port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        while http(port, "GET", "/status", None).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not answer");
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().expect("a profile directory");
        let dir = profile.path().to_path_buf();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            // The map is served over TLS with a certificate made for the test.
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1400,1000",
                    format!("--user-data-dir={}", dir.display())]
            }
        }}});
        let answer = http(port, "POST", "/session", Some(&caps)).expect("a session");
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        Browser {
            driver,
            port,
            session,
            _profile: profile,
        }
    }

    fn call(&self, method: &str, verb: &str, body: Option<&Value>) -> Value {
        let path = format!("/session/{}/{verb}", self.session);
        let answer = http(self.port, method, &path, body).expect("chromedriver answers");
        if answer["value"]["error"].is_string() {
            panic!("{verb}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    pub fn goto(&self, url: &str) {
        self.call("POST", "url", Some(&json!({"url": url})));
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    pub fn run(&self, script: &str, args: Value) -> Value {
        self.call(
            "POST",
            "execute/sync",
            Some(&json!({"script": script, "args": args})),
        )
    }

    /// Waits until `script` returns true, up to `within`; how long it took.
    pub fn wait_for(&self, script: &str, args: Value, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < within {
            if self.run(script, args.clone()) == Value::Bool(true) {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// A PNG of the window.
    pub fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let text = self.call("GET", "screenshot", None);
        base64::engine::general_purpose::STANDARD
            .decode(text.as_str().unwrap_or_default())
            .expect("base64 PNG")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let path = format!("/session/{}", self.session);
        let _ = http(self.port, "DELETE", &path, None);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
