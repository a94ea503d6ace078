//! Answers on their way to the handlers that wait for them.
//!
//! A committed entry answers every request in it at once, and a read round every read that shared it.
//! Each answer is counted from when it is handed over until its handler takes it (a `Handed` travels
//! with it and is dropped there). While any is on its way, a connection about to write lets the tasks
//! ready to run go first, so that responses finished together leave in one write
//! (`frontend/coalesce.rs`). When none is, there is nothing to wait for and the write goes at once:
//! with one client, giving way then only cost a wake-up of another tokio worker per response.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A count of answers handed over and not yet taken.
#[derive(Debug, Default)]
pub struct Answers {
    on_their_way: AtomicUsize,
}

/// The member's answers: what the proposer and the read rounds hand over, and what every client
/// connection's writer looks at.
pub(crate) static ANSWERS: Answers = Answers::new();

impl Answers {
    pub const fn new() -> Answers {
        Answers { on_their_way: AtomicUsize::new(0) }
    }

    /// Counts one more answer on its way until the returned `Handed` is dropped.
    pub fn hand(&'static self) -> Handed {
        self.on_their_way.fetch_add(1, Ordering::Relaxed);
        Handed { answers: self }
    }

    /// Some answer is on its way: a response may be about to join the one being written.
    pub fn on_their_way(&self) -> bool {
        self.on_their_way.load(Ordering::Relaxed) > 0
    }
}

/// One answer on its way; dropped when its handler takes the answer (or when the answer is dropped
/// undelivered, its handler gone).
#[derive(Debug)]
#[must_use = "the answer counts as on its way until this is dropped"]
pub struct Handed {
    answers: &'static Answers,
}

impl Drop for Handed {
    fn drop(&mut self) {
        self.answers.on_their_way.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_on_its_way_until_taken_or_dropped_undelivered() {
        static ANSWERS: Answers = Answers::new();
        assert!(!ANSWERS.on_their_way());
        let taken = ANSWERS.hand();
        let (tx, rx) = tokio::sync::oneshot::channel::<Handed>();
        tx.send(ANSWERS.hand()).unwrap();
        assert!(ANSWERS.on_their_way());
        drop(taken);
        assert!(ANSWERS.on_their_way(), "one is still in the channel");
        drop(rx); // its handler went away: the answer is dropped with the channel
        assert!(!ANSWERS.on_their_way());
    }
}
