//! A real browser for the console's tests: Debian's headless Chromium driven through
//! ChromeDriver's W3C WebDriver protocol (JSON over HTTP), with only the commands the tests
//! use. Each browser has its own ChromeDriver on a free port and its own profile
//! directory, both gone when it is dropped.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use super::proxies::free_port;

/// The W3C name of an element reference in answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// WebDriver's key codes.
pub const TAB: &str = "\u{E004}";
pub const ENTER: &str = "\u{E007}";

/// One headless Chromium session.
pub struct Browser {
    driver: tokio::process::Child,
    http: Client<HttpConnector, Full<Bytes>>,
    base: String,
    profile: PathBuf,
    /// Where screenshots go (kept after the run).
    pub shots: PathBuf,
}

/// An element of the current page.
#[derive(Clone, Debug)]
pub struct Element(String);

impl Browser {
    /// Starts ChromeDriver and a headless Chromium with a fresh profile.
    pub async fn start(shots: &str) -> Browser {
        let driver_bin = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("chromedriver (Debian's chromium-driver; tests/run --setup installs it)");
        let port = free_port();
        let driver = tokio::process::Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let profile =
            std::env::temp_dir().join(format!("idemproxy-chromium-{}-{port}", std::process::id()));
        let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("console-screenshots")
            .join(shots);
        std::fs::create_dir_all(&shots).unwrap();
        let mut browser = Browser {
            driver,
            http: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://127.0.0.1:{port}"),
            profile,
            shots,
        };
        let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("chromium (Debian's; tests/run --setup installs it)");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": binary,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,900", "--no-first-run", "--disable-extensions",
                         format!("--user-data-dir={}", browser.profile.display())]
            }
        }}});
        // ChromeDriver takes a moment to listen.
        let mut session = None;
        for _ in 0..100 {
            match browser.try_call("POST", "/session", Some(&caps)).await {
                Ok(v) => {
                    session = v["sessionId"].as_str().map(str::to_owned);
                    assert!(session.is_some(), "no session: {v}");
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let session = session.expect("chromedriver answers");
        browser.base = format!("{}/session/{session}", browser.base);
        browser
    }

    async fn try_call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let req = Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json")
            .body(Full::new(body))
            .unwrap();
        let resp = self.http.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{method} {path}: {status} {v}"));
        }
        Ok(v["value"].clone())
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.try_call(method, path, body.as_ref())
            .await
            .unwrap_or_else(|e| panic!("webdriver: {e}"))
    }

    /// Opens `url` and waits for the page to load.
    pub async fn go(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url }))).await;
    }

    pub async fn url(&self) -> String {
        self.call("GET", "/url", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub async fn title(&self) -> String {
        self.call("GET", "/title", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The page's visible text.
    pub async fn text(&self) -> String {
        let body = self.find("body").await;
        self.text_of(&body).await
    }

    /// The first element `css` matches (waits up to 5 s for it).
    pub async fn find(&self, css: &str) -> Element {
        for _ in 0..50 {
            if let Some(e) = self.try_find(css).await {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "no element {css} on {}:\n{}",
            self.url().await,
            self.source().await
        )
    }

    pub async fn try_find(&self, css: &str) -> Option<Element> {
        let v = self
            .try_call(
                "POST",
                "/element",
                Some(&json!({"using": "css selector", "value": css})),
            )
            .await
            .ok()?;
        v[ELEMENT].as_str().map(|id| Element(id.to_owned()))
    }

    /// Types `text` into an element.
    pub async fn type_into(&self, e: &Element, text: &str) {
        self.call(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        )
        .await;
    }

    pub async fn click(&self, e: &Element) {
        self.call("POST", &format!("/element/{}/click", e.0), Some(json!({})))
            .await;
    }

    pub async fn text_of(&self, e: &Element) -> String {
        self.call("GET", &format!("/element/{}/text", e.0), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The element that has the keyboard focus.
    pub async fn focused(&self) -> Element {
        let v = self.call("GET", "/element/active", None).await;
        Element(v[ELEMENT].as_str().expect("a focused element").to_owned())
    }

    /// Presses keys on whatever has the focus (the keyboard alone, no pointer).
    pub async fn keys(&self, keys: &str) {
        let mut actions = Vec::new();
        for k in keys.chars() {
            actions.push(json!({"type": "keyDown", "value": k.to_string()}));
            actions.push(json!({"type": "keyUp", "value": k.to_string()}));
        }
        self.call(
            "POST",
            "/actions",
            Some(json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]})),
        )
        .await;
        self.call("DELETE", "/actions", None).await;
    }

    /// Runs `script` in the page and returns its value.
    pub async fn script(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    pub async fn source(&self) -> String {
        self.call("GET", "/source", None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The browser's cookies for the current page.
    pub async fn cookies(&self) -> Vec<Value> {
        self.call("GET", "/cookie", None)
            .await
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Saves a PNG of the viewport as `{name}.png` in [`Browser::shots`].
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let v = self.call("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("a base64 PNG");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

impl Browser {
    /// Ends the session: Chromium exits with it.
    pub async fn quit(self) {
        let _ = self.try_call("DELETE", "", None).await;
    }
}

impl Drop for Browser {
    /// Also after a failed assertion: ChromeDriver, and the Chromium processes it started
    /// (found by their profile directory, which is this browser's own), then the profile.
    fn drop(&mut self) {
        let _ = self.driver.start_kill();
        let pattern = format!("--user-data-dir={}", self.profile.display());
        let _ = std::process::Command::new("pkill")
            .args(["-f", "--", &pattern])
            .status();
        // They write to the profile until they are gone.
        for _ in 0..40 {
            let alive = std::process::Command::new("pgrep")
                .args(["-f", "--", &pattern])
                .output()
                .is_ok_and(|o| !o.stdout.is_empty());
            if !alive {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
