//! Progress on long waits: a spinner with the elapsed time (and a count, when there is one)
//! on standard error, redrawn in place. Silent when standard error is not a terminal, so
//! scripts and logs see only the final output.

use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A running spinner; it stops when finished or dropped.
#[derive(Debug)]
pub struct Spinner {
    shared: Option<Arc<Shared>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    message: Mutex<String>,
    done: AtomicU64,
    total: AtomicU64,
    stop: AtomicBool,
}

impl Spinner {
    /// Starts a spinner showing `message` (nothing at all when stderr is not a terminal,
    /// or `TANGRAM_NO_PROGRESS` is set).
    pub fn start(message: impl Into<String>) -> Self {
        let message = message.into();
        if !std::io::stderr().is_terminal() || std::env::var_os("TANGRAM_NO_PROGRESS").is_some() {
            return Self {
                shared: None,
                thread: None,
            };
        }
        let shared = Arc::new(Shared {
            message: Mutex::new(message),
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
            let start = Instant::now();
            let mut i = 0;
            while !s.stop.load(Ordering::Relaxed) {
                let msg = s.message.lock().map(|m| m.clone()).unwrap_or_default();
                let (done, total) = (
                    s.done.load(Ordering::Relaxed),
                    s.total.load(Ordering::Relaxed),
                );
                let count = if total > 0 {
                    format!(" {done}/{total}")
                } else {
                    String::new()
                };
                let mut err = std::io::stderr().lock();
                let _ = write!(
                    err,
                    "\r\x1b[2K{} {msg}{count} ({} s)",
                    FRAMES[i % FRAMES.len()],
                    start.elapsed().as_secs()
                );
                let _ = err.flush();
                drop(err);
                i += 1;
                std::thread::sleep(Duration::from_millis(120));
            }
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        });
        Self {
            shared: Some(shared),
            thread: Some(thread),
        }
    }

    /// Changes the message.
    pub fn set_message(&self, message: impl Into<String>) {
        if let Some(s) = &self.shared {
            if let Ok(mut m) = s.message.lock() {
                *m = message.into();
            }
        }
    }

    /// Shows `done/total`.
    pub fn set_count(&self, done: u64, total: u64) {
        if let Some(s) = &self.shared {
            s.done.store(done, Ordering::Relaxed);
            s.total.store(total, Ordering::Relaxed);
        }
    }

    /// Stops the spinner and clears its line.
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(s) = &self.shared {
            s.stop.store(true, Ordering::Relaxed);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop();
    }
}
