//! The hand-off of wake-ups from the raft thread to the gRPC runtime: the answers to the request
//! handlers waiting there, and what the apply observer sets off after each batch (the watch hub's
//! commit, the wake-up of the requests waiting for an applied index).
//!
//! Why not wake them from the raft thread: that wakes a task from outside its runtime. tokio then
//! queues the task and unparks a worker in the "searching" state, and a searching worker that finds
//! work unparks another worker in turn. That is two thread wake-ups per wake, and with one client the
//! second one finds nothing to do (an eventfd write or a futex wake for nothing, about one per put
//! under `perf`).
//!
//! The relay rings a doorbell instead: one end of a socket pair, the other end registered with the
//! gRPC runtime's I/O driver. The worker parked on the driver wakes for an I/O event, which tokio does
//! not count as searching, and the relay's task there runs the queued jobs. The tasks they wake are
//! woken from inside the runtime: the first runs next on the same worker, and another worker is woken
//! only when more are queued. Under load one ring carries a whole entry's answers and its commit.

use std::io::{self, Write};
use std::os::unix::net::UnixStream as Bell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::net::UnixStream;
use tokio::sync::oneshot;

/// Work that wakes tasks of the gRPC runtime, run there by the relay's task, in the order handed over.
type Job = Box<dyn FnOnce() + Send>;

/// The raft thread's side of the relay. Dropping it stops the relay's task.
pub(crate) struct Relay {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Set by the first job queued after the relay's task last took the queue: later jobs find the
    /// doorbell rung already.
    rung: AtomicBool,
    bell: Bell,
}

struct Queue {
    jobs: Vec<Job>,
    /// The relay's task is gone (its runtime shut down): jobs run where they are handed over.
    closed: bool,
}

impl Relay {
    /// Starts the relay's task on the current runtime, which must be the one whose tasks the jobs
    /// wake.
    pub(crate) fn start() -> io::Result<Relay> {
        let (bell, door) = Bell::pair()?;
        bell.set_nonblocking(true)?;
        door.set_nonblocking(true)?;
        let door = UnixStream::from_std(door)?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue { jobs: Vec::new(), closed: false }),
            rung: AtomicBool::new(false),
            bell,
        });
        tokio::spawn(relay(Closing(Arc::downgrade(&shared)), door));
        Ok(Relay { shared })
    }

    /// Sends each value to its oneshot from the relay's task.
    pub(crate) fn send<T: Send + 'static>(&self, answers: impl IntoIterator<Item = (oneshot::Sender<T>, T)>) {
        let answers: Vec<_> = answers.into_iter().collect();
        self.run(move || {
            for (to, answer) in answers {
                let _ = to.send(answer); // a handler that gave up drops its answer
            }
        });
    }

    /// Runs `job` on the relay's task, after the jobs handed over before it.
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) {
        let mut queue = self.shared.lock();
        if queue.closed {
            drop(queue);
            job();
            return;
        }
        queue.jobs.push(Box::new(job));
        drop(queue);
        if !self.shared.rung.swap(true, Ordering::SeqCst) {
            if let Err(e) = (&self.shared.bell).write(&[1]) {
                // Not expected: at most a byte or two are ever unread. The relay's task would miss
                // these jobs, so they run here, and the next job tries the doorbell again.
                tracing::warn!(error = %e, "relay's doorbell failed; waking from the raft thread");
                let jobs = std::mem::take(&mut self.shared.lock().jobs);
                self.shared.rung.store(false, Ordering::SeqCst);
                run_all(jobs);
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn run_all(jobs: Vec<Job>) {
    for job in jobs {
        job();
    }
}

async fn relay(closing: Closing, door: UnixStream) {
    let mut rings = [0u8; 64];
    loop {
        if door.readable().await.is_err() {
            return;
        }
        match door.try_read(&mut rings) {
            Ok(0) => return, // the raft thread's end is closed: the relay was dropped
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!(error = %e, "relay's doorbell failed; waking from the raft thread");
                return;
            }
        }
        let Some(shared) = closing.0.upgrade() else { return };
        // Reset before taking the queue: a job queued after the take rings again.
        shared.rung.store(false, Ordering::SeqCst);
        let jobs = std::mem::take(&mut shared.lock().jobs);
        drop(shared);
        run_all(jobs);
    }
}

/// Held by the relay's task, dropped however it ends (its runtime may drop it mid-wait): from then on
/// jobs run where they are handed over, and none queued meanwhile is left behind.
struct Closing(Weak<Shared>);

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade() {
            let mut queue = shared.lock();
            queue.closed = true;
            let jobs = std::mem::take(&mut queue.jobs);
            drop(queue);
            run_all(jobs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(workers: usize) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap()
    }

    /// Handlers waiting on the runtime, answered one at a time from a thread outside it (as the raft
    /// thread answers) by `answer`, with a pause between answers in which the workers park again.
    /// Returns the times the runtime's workers parked meanwhile.
    fn answer_one_by_one(runtime: &tokio::runtime::Runtime, answer: impl Fn(oneshot::Sender<u32>, u32)) -> u64 {
        const HANDLERS: u32 = 200;
        let (senders, handlers): (Vec<_>, Vec<_>) = (0..HANDLERS)
            .map(|_| {
                let (to, answer) = oneshot::channel::<u32>();
                (to, runtime.spawn(answer))
            })
            .unzip();
        std::thread::sleep(std::time::Duration::from_millis(50)); // every handler waits
        let parks = || {
            let metrics = runtime.metrics();
            (0..metrics.num_workers()).map(|w| metrics.worker_park_count(w)).sum::<u64>()
        };
        let before = parks();
        for ((to, handler), n) in senders.into_iter().zip(handlers).zip(0..) {
            answer(to, n);
            assert_eq!(futures::executor::block_on(handler).unwrap(), Ok(n), "each handler gets its answer");
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        parks() - before
    }

    #[test]
    fn an_answer_wakes_one_worker_where_a_send_from_outside_wakes_two() {
        // A oneshot sent from outside the runtime unparks a worker as a searcher, and that one unparks
        // the other; the relay's doorbell wakes only the worker parked on the I/O driver.
        let runtime = runtime(2);
        let relay = runtime.block_on(async { Relay::start().unwrap() });
        let direct = answer_one_by_one(&runtime, |to, n| to.send(n).unwrap());
        let relayed = answer_one_by_one(&runtime, |to, n| relay.send([(to, n)]));
        assert!(
            relayed * 4 < direct * 3,
            "workers parked {relayed} times for relayed answers, {direct} for direct ones"
        );
    }

    #[test]
    fn every_answer_arrives_however_they_are_handed_over() {
        let runtime = runtime(2);
        let relay = Arc::new(runtime.block_on(async { Relay::start().unwrap() }));
        // Four threads hand over answers concurrently, in batches of 1 to 7, while the relay's task
        // takes the queue: none may be left waiting (a lost ring would hang this test).
        let handed: Vec<_> = (0..4u32)
            .map(|thread| {
                let relay = relay.clone();
                let handle = runtime.handle().clone();
                std::thread::spawn(move || {
                    for round in 0..250u32 {
                        let count = 1 + (round + thread) % 7;
                        let (senders, answers): (Vec<_>, Vec<_>) = (0..count).map(|_| oneshot::channel()).unzip();
                        relay.send(senders.into_iter().zip(0..).map(|(to, n)| (to, (thread, round, n))));
                        let got: Vec<_> = handle.block_on(futures::future::join_all(answers));
                        let want: Vec<_> = (0..count).map(|n| Ok((thread, round, n))).collect();
                        assert_eq!(got, want);
                    }
                })
            })
            .collect();
        for thread in handed {
            thread.join().unwrap();
        }
    }

    #[test]
    fn jobs_run_on_the_runtime_in_the_order_they_were_handed_over() {
        // The watch hub's commits go through the relay: out of order, it would see gaps.
        let runtime = runtime(2);
        let relay = runtime.block_on(async { Relay::start().unwrap() });
        let (seen, mut ran) = tokio::sync::mpsc::unbounded_channel();
        let raft_thread = std::thread::spawn(move || {
            for n in 0..1000u32 {
                let seen = seen.clone();
                relay.run(move || {
                    let on_runtime = tokio::runtime::Handle::try_current().is_ok();
                    seen.send((n, on_runtime)).unwrap();
                });
            }
            relay
        });
        let relay = raft_thread.join().unwrap();
        let got: Vec<_> = runtime.block_on(async {
            let mut got = Vec::new();
            for _ in 0..1000 {
                got.push(ran.recv().await);
            }
            got
        });
        let want: Vec<_> = (0..1000).map(|n| Some((n, true))).collect();
        assert_eq!(got, want);
        drop(relay);
    }

    #[test]
    fn answers_handed_over_after_the_runtime_stopped_still_arrive() {
        let runtime = runtime(1);
        let relay = runtime.block_on(async { Relay::start().unwrap() });
        let (queued, answer) = oneshot::channel();
        drop(runtime); // the relay's task is dropped with it
        relay.send([(queued, 7)]);
        assert_eq!(answer.blocking_recv().unwrap(), 7);
    }

    #[test]
    fn answers_still_arrive_when_the_doorbell_fails_every_time() {
        // A doorbell whose far end is gone and no relay task to notice: every ring fails, and every
        // answer must still reach its receiver, not wait in the queue for a ring that never comes.
        let (bell, door) = Bell::pair().unwrap();
        drop(door);
        let relay = Relay {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue { jobs: Vec::new(), closed: false }),
                rung: AtomicBool::new(false),
                bell,
            }),
        };
        for n in 0..3 {
            let (to, mut answer) = oneshot::channel();
            relay.send([(to, n)]);
            assert_eq!(answer.try_recv(), Ok(n), "answer {n} arrived");
        }
    }

    #[test]
    fn dropping_the_relay_ends_its_task() {
        let runtime = runtime(1);
        let relay = runtime.block_on(async { Relay::start().unwrap() });
        assert_eq!(runtime.metrics().num_alive_tasks(), 1);
        drop(relay);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while runtime.metrics().num_alive_tasks() > 0 {
            assert!(std::time::Instant::now() < deadline, "the relay's task is still running");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
