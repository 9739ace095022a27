//! Helpers for the server tests: a "scripted" tiny model with Qwen2.5's whole vocabulary, the
//! server as a child process on a loopback port, and a minimal HTTP/1.1 client over std sockets.
//!
//! The scripted model: random weights (hidden 32, 2 layers, vocab 151,936, untied) whose
//! attention and MLP outputs are scaled down, so each next-token distribution is dominated by the
//! current token; for every (text, continuation) pair of the script, the LM head row of each
//! continuation token points along the embedding of the token before it with a large margin
//! (logit ~ 22 against a background of ~12 nats). Greedy and temperature-1 sampling then follow
//! the continuation (`<tool_call>` blocks, stop tokens), while other prompts give random but
//! deterministic tokens: real attention, real prefix caching, real sampling.

use super::bin_path;
use half::bf16;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use swerve::config::ModelConfig;
use swerve::model::params::Qwen2Params;
use swerve::model::weights::write_safetensors;
use swerve::rng::{Rng, SplitMix64};
use swerve::tensor::HostTensor;
use swerve::tokenizer::Tokenizer;

pub const VOCAB: usize = 151_936;
pub const CONTEXT: usize = 4096;
pub const MODEL_NAME: &str = "scripted-qwen";

/// After the chat generation prompt (`<|im_start|>assistant\n`), a tool call then `<|im_end|>`.
pub const CHAT_TOOL_CALL: &str =
    "<tool_call>{\"name\":\"sleep\",\"arguments\":{\"seconds\":5}}</tool_call><|im_end|>";
/// After "The answer is".
pub const ANSWER_PROMPT: &str = "The answer is";
pub const ANSWER: &str = " forty-two.<|im_end|>";

pub fn script() -> Vec<(&'static str, &'static str)> {
    vec![
        ("<|im_start|>assistant\n", CHAT_TOOL_CALL),
        (ANSWER_PROMPT, ANSWER),
    ]
}

/// Writes the scripted model into `dir` (config.json + model.safetensors); `seed` varies the
/// random weights (a second checkpoint for weight reloads).
pub fn write_scripted_model(dir: &Path, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let config = json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "rope_theta": 10000.0,
        "rope_scaling": null, "torch_dtype": "bfloat16",
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let config = ModelConfig::from_dir(dir).unwrap();
    let local = config.local_sizes(1).unwrap();
    let d = config.hidden_size;
    let tokenizer = Tokenizer::qwen25().unwrap();
    // source token -> the tokens that follow it in the script
    let mut next: HashMap<u32, u32> = HashMap::new();
    for (text, continuation) in script() {
        let mut ids = vec![*tokenizer.encode(text).unwrap().last().unwrap()];
        ids.extend(tokenizer.encode(continuation).unwrap());
        for pair in ids.windows(2) {
            let old = next.insert(pair[0], pair[1]);
            assert!(
                old.is_none() || old == Some(pair[1]),
                "script: token {} is followed by both {:?} and {}",
                pair[0],
                old,
                pair[1]
            );
        }
    }
    let mut rng = SplitMix64::new(seed);
    let mut embed = Vec::new();
    let mut tensors = Vec::new();
    for (name, shape) in Qwen2Params::<()>::expected_tensors(&config, &local) {
        let numel: usize = shape.iter().product();
        let scale = if name.ends_with("norm.weight") {
            0.0
        } else if name.contains("o_proj") || name.contains("down_proj") {
            0.1 * (3.0 / shape[1] as f32).sqrt()
        } else if name.contains("embed_tokens") {
            1.0
        } else if name.contains("lm_head") || shape.len() == 1 {
            0.1
        } else {
            (3.0 / shape[1] as f32).sqrt()
        };
        let mut values: Vec<f32> = (0..numel)
            .map(|_| {
                if scale == 0.0 {
                    1.0
                } else {
                    scale * rng.next_signed_f32()
                }
            })
            .collect();
        if name.contains("embed_tokens") {
            embed = values.clone();
        }
        if name.contains("lm_head") {
            for row in next.values() {
                values[*row as usize * d..(*row as usize + 1) * d].fill(0.0);
            }
            for (&source, &target) in &next {
                let e = &embed[source as usize * d..(source as usize + 1) * d];
                let norm = e.iter().map(|x| x * x).sum::<f32>().sqrt();
                for k in 0..d {
                    values[target as usize * d + k] += 4.0 * e[k] / norm;
                }
            }
        }
        let bf: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
        tensors.push((name, HostTensor::from_bf16(shape, &bf)));
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors).unwrap();
}

/// The scripted model, written once per test process into a temporary folder.
pub fn scripted_model() -> PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        write_scripted_model(dir.path(), 0x5EED);
        dir
    })
    .path()
    .to_path_buf()
}

/// `swerve-serve` as a child process on 127.0.0.1, killed on drop.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts the server on `model` with `--port 0` and the extra arguments.
    #[allow(clippy::zombie_processes)] // waited for in Drop
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(bin_path("swerve-serve"))
            .args([
                "--model",
                model.to_str().unwrap(),
                "--port",
                "0",
                "--device",
                "cpu",
            ])
            .args(["--served-model-name", MODEL_NAME])
            .args(if extra.contains(&"--num-kv-blocks") {
                &[][..]
            } else {
                &["--num-kv-blocks", "1024"][..]
            })
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting swerve-serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut err = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            if stdout.read_line(&mut line).unwrap() == 0 {
                let _ = child.wait();
                let _ = reader.join();
                panic!(
                    "swerve-serve exited before listening:\n{}",
                    stderr.lock().unwrap()
                );
            }
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr = rest.split_whitespace().next().unwrap().parse().unwrap();
                // Keep draining stdout so the child never blocks on a full pipe.
                std::thread::spawn(move || {
                    let mut sink = String::new();
                    let _ = stdout.read_to_string(&mut sink);
                });
                return Server {
                    child,
                    addr,
                    stderr,
                };
            }
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn post(&self, path: &str, body: &Value) -> Response {
        request(self.addr, "POST", path, &[], body.to_string().as_bytes())
    }

    pub fn post_raw(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        request(self.addr, "POST", path, headers, body)
    }

    pub fn get(&self, path: &str) -> Response {
        request(self.addr, "GET", path, &[], b"")
    }

    /// A Prometheus metric's value (the first sample of that name).
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").text();
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    /// Waits until the KV pool has no used blocks and nothing is in flight.
    pub fn wait_idle(&self) {
        for _ in 0..200 {
            if self.metric("swerve_kv_blocks_used") == 0.0
                && self.metric("swerve_sequences_in_flight") == 0.0
                && self.metric("swerve_engine_running") == 0.0
                && self.metric("swerve_engine_waiting") == 0.0
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the server never became idle:\n{}",
            self.get("/metrics").text()
        );
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Whether the server's log comes to contain `needle` within 10 s. The log is read by a
    /// thread of its own, so a line written while a response was sent may arrive after it.
    pub fn stderr_comes_to_contain(&self, needle: &str) -> bool {
        for _ in 0..200 {
            if self.stderr.lock().unwrap().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {}",
                self.status,
                self.text()
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body, `[DONE]` included.
    pub fn events(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: ").map(str::to_string))
            .collect()
    }

    /// An OpenAI error body with this status and (when given) this `param`.
    pub fn assert_error(&self, status: u16, param: Option<&str>) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        let body = self.json();
        let error = &body["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert!(error["type"].is_string(), "{body}");
        if let Some(param) = param {
            assert_eq!(error["param"], json!(param), "{body}");
        }
        body
    }
}

/// Writes an HTTP/1.1 request; the connection closes after the response.
pub fn send_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connecting to the server");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    stream
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let stream = send_request(addr, method, path, headers, body);
    read_response(stream)
}

pub fn read_response(stream: TcpStream) -> Response {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("bad status line {line:?}"))
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            let size = usize::from_str_radix(line.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = get("content-length") {
        body.resize(len.parse().unwrap(), 0);
        reader.read_exact(&mut body).unwrap();
    } else {
        reader.read_to_end(&mut body).unwrap();
    }
    Response {
        status,
        headers,
        body,
    }
}

/// The bash command the agent model runs every turn: it creates one file per run in its working
/// folder and prints mini-swe-agent's submission sentinel on the third run (so an episode takes
/// three steps, then ends with `Submitted`). POSIX sh (agents run commands with `sh -c`), and
/// written so that no token of the whole reply has two different successors (the bigram model
/// cannot branch).
pub const AGENT_COMMAND: &str =
    "mktemp --tmpdir=. >/dev/null; test $(ls | wc -l) = 3 && echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT";

/// The agent model's reply after a chat generation prompt: one `bash` tool call.
pub fn agent_reply() -> String {
    format!(
        "<tool_call>{{\"name\": \"bash\",\"arguments\":{{\"command\":\"{AGENT_COMMAND}\"}}}}</tool_call><|im_end|>"
    )
}

/// A model folder whose every chat turn is [`agent_reply`]: `write_bigram_model` (one zeroed
/// layer, one-hot embeddings) continuing "<|im_start|>assistant\n" with the reply, at
/// probability ~1 at temperature 1.
pub fn agent_model() -> PathBuf {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let tokenizer = Tokenizer::qwen25().unwrap();
        let mut ids = vec![*tokenizer
            .encode("<|im_start|>assistant\n")
            .unwrap()
            .last()
            .unwrap()];
        ids.extend(tokenizer.encode(&agent_reply()).unwrap());
        let pairs: Vec<(u32, u32)> = ids.windows(2).map(|w| (w[0], w[1])).collect();
        swerve::model::synthetic::write_bigram_model(dir.path(), &pairs, VOCAB).unwrap();
        dir
    })
    .path()
    .to_path_buf()
}
