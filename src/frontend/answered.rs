//! Whether a client connection has had a request answered, read from the bytes the server writes
//! on it (`AnswerScan`): the sign `connection_limits.rs` takes that a connection belongs to a real
//! client, not to someone holding a slot with a half-sent request.
//!
//! Read on the server's side of the connection, after TLS, so it sees the server's own well-formed
//! output and works the same under tonic (a member) and hyper (the proxy), for gRPC and the HTTP
//! gateway, without a hook in any service:
//! - HTTP/2: a DATA frame with a payload or the end of a stream (a response message, a finished
//!   response), or a HEADERS frame that ends its stream (a status-only answer, an error). The
//!   server's SETTINGS, pings and window updates, and the response headers a stream handler sends
//!   before it has read anything (a watch opened with nothing in it), are not answers.
//! - HTTP/1.1: a response head whose status is not `1xx` (`100 Continue` is sent before the body).

/// Scans what the server writes on one connection until a request is answered.
#[derive(Debug, Default)]
pub(crate) struct AnswerScan {
    state: State,
}

#[derive(Debug, Default)]
enum State {
    /// Nothing written yet: the first byte tells HTTP/1.1 (`HTTP/1.1 ...`) from HTTP/2 (a frame).
    #[default]
    Start,
    Http2 {
        /// The frame header being read.
        header: [u8; FRAME_HEADER],
        have: usize,
        /// Payload bytes of the current frame still to pass.
        skip: usize,
    },
    Http1,
    Answered,
}

const FRAME_HEADER: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const END_STREAM: u8 = 0x1;

impl AnswerScan {
    pub(crate) fn answered(&self) -> bool {
        matches!(self.state, State::Answered)
    }

    /// Takes the next bytes the server wrote; true once a request has been answered.
    pub(crate) fn wrote(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            match &mut self.state {
                State::Answered => return true,
                State::Start => {
                    self.state = if bytes[0] == b'H' {
                        State::Http1
                    } else {
                        State::Http2 { header: [0; FRAME_HEADER], have: 0, skip: 0 }
                    };
                }
                State::Http1 => {
                    // A response head starts a write of its own (hyper writes the head first).
                    // `HTTP/1.1 200`: the status's first digit follows the minor version and a space.
                    let status = bytes.strip_prefix(b"HTTP/1.").and_then(|rest| rest.get(2));
                    if status.is_some_and(|&digit| digit != b'1') {
                        self.state = State::Answered;
                    }
                    return self.answered();
                }
                State::Http2 { header, have, skip } => {
                    if *skip > 0 {
                        let passed = (*skip).min(bytes.len());
                        *skip -= passed;
                        bytes = &bytes[passed..];
                        continue;
                    }
                    let take = (FRAME_HEADER - *have).min(bytes.len());
                    header[*have..*have + take].copy_from_slice(&bytes[..take]);
                    *have += take;
                    bytes = &bytes[take..];
                    if *have < FRAME_HEADER {
                        continue;
                    }
                    let length = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
                    let (kind, flags) = (header[3], header[4]);
                    let ends_stream = flags & END_STREAM != 0;
                    if (kind == DATA && (length > 0 || ends_stream)) || (kind == HEADERS && ends_stream) {
                        self.state = State::Answered;
                    } else {
                        *have = 0;
                        *skip = length;
                    }
                }
            }
        }
        self.answered()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let n = payload.len();
        let mut f = vec![(n >> 16) as u8, (n >> 8) as u8, n as u8, kind, flags, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    }

    fn scan(writes: &[&[u8]]) -> bool {
        let mut scan = AnswerScan::default();
        writes.iter().fold(false, |_, w| scan.wrote(w))
    }

    #[test]
    fn settings_pings_and_bare_response_headers_are_not_answers() {
        let settings = frame(0x4, 0, &[0, 3, 0, 0, 0, 100]);
        let ack = frame(0x4, 0x1, &[]);
        let ping = frame(0x6, 0, b"12345678");
        let window = frame(0x8, 0, &[0, 1, 0, 0]);
        let headers = frame(HEADERS, 0x4, b"\x88");
        assert!(!scan(&[&settings, &ack, &ping, &window, &headers]));
        // A HEADERS frame's END_HEADERS flag (0x4) is not END_STREAM; payload bytes that look like
        // an answering frame header are passed over.
        let tricky = frame(0x6, 0, &frame(DATA, 0, b"x")[..8]);
        assert!(!scan(&[&tricky]));
    }

    #[test]
    fn a_response_message_or_a_finished_stream_is_an_answer_even_split_across_writes() {
        assert!(scan(&[&frame(DATA, 0, b"\0\0\0\0\x02ok")]));
        assert!(scan(&[&frame(HEADERS, 0x5, b"\x88")]), "trailers-only (an error status)");
        assert!(scan(&[&frame(DATA, END_STREAM, b"")]));
        let mut output = frame(0x4, 0, &[0, 3, 0, 0, 0, 100]);
        output.extend(frame(HEADERS, 0x4, b"\x88"));
        output.extend(frame(DATA, 0, b"\0\0\0\0\x02ok"));
        for cut in 0..output.len() {
            let (a, b) = output.split_at(cut);
            assert!(scan(&[a, b]), "split at {cut}");
            if cut < output.len() - 7 {
                assert!(!scan(&[a]), "only the first {cut} bytes");
            }
        }
    }

    #[test]
    fn http1_answers_are_final_status_lines() {
        assert!(scan(&[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"]));
        assert!(scan(&[b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n\r\n"]));
        assert!(!scan(&[b"HTTP/1.1 100 Continue\r\n\r\n"]));
    }
}
