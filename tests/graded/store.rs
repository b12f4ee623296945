//! Ungraded checks of the rendezvous store (`workbook::distributed::store`):
//! what ranks exchange through it, and that nothing a stray connection or a
//! dead host does turns into a crash or a hang.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use workbook::distributed::auth::{self, Purpose};
use workbook::distributed::store::{StoreClient, StoreServer};
use workbook::distributed::BusyBoard;

const TOKEN: &str = "job-token";
/// Longer than any healthy request takes, short enough that a hang fails fast.
const TIMEOUT: Duration = Duration::from_secs(2);

/// A server on a free loopback port, and its address.
fn server() -> (StoreServer, String) {
    let server = StoreServer::bind("127.0.0.1:0", TOKEN).expect("binding 127.0.0.1:0 failed");
    let addr = server.local_addr().to_string();
    (server, addr)
}

fn client(addr: &str) -> StoreClient {
    StoreClient::connect(addr, TOKEN, TIMEOUT).expect("connecting to a running store failed")
}

/// The server still answers: a fresh client can set and read a key.
fn assert_serves(addr: &str, what: &str) {
    let store = client(addr);
    store.set("alive", b"yes").unwrap_or_else(|e| panic!("after {what}, set failed: {e}"));
    let value = store.get("alive", TIMEOUT).unwrap_or_else(|e| panic!("after {what}, get failed: {e}"));
    assert_eq!(value, b"yes", "after {what}, the store returned a wrong value");
}

#[test]
fn set_then_get_round_trips_between_two_clients() {
    let (_server, addr) = server();
    let (rank0, rank1) = (client(&addr), client(&addr));
    rank0.set("nccl_id", &[7; 128]).unwrap();
    let got = rank1.get("nccl_id", TIMEOUT).expect("get of a key another client set failed");
    assert_eq!(got, vec![7; 128], "rank 1 read different bytes than rank 0 set");
}

#[test]
fn get_waits_for_a_later_set_from_another_thread() {
    let (_server, addr) = server();
    let setter = client(&addr);
    let later = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        setter.set("rank1/addr", b"10.0.0.2:4000").unwrap();
    });
    let got = client(&addr).get("rank1/addr", TIMEOUT);
    later.join().unwrap();
    let got = got.expect("get must wait for a key set later instead of failing");
    assert_eq!(got, b"10.0.0.2:4000", "get returned a different value than was set");
}

#[test]
fn get_times_out_with_timed_out_naming_the_key() {
    let (_server, addr) = server();
    let started = Instant::now();
    let err = client(&addr).get("never/set", Duration::from_millis(100)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut, "a missing key must time out: {err}");
    assert!(err.to_string().contains("never/set"), "the error must name the key: {err}");
    assert!(started.elapsed() < TIMEOUT, "get took {:?} for a 100 ms timeout", started.elapsed());
}

#[test]
fn add_is_atomic_across_threads() {
    let (_server, addr) = server();
    thread::scope(|s| {
        for _ in 0..4 {
            let store = client(&addr);
            s.spawn(move || {
                for _ in 0..100 {
                    store.add("count", 1).expect("add failed");
                }
            });
        }
    });
    let total = client(&addr).add("count", 0).unwrap();
    assert_eq!(total, 400, "4 threads x 100 adds of 1 lost some increments");
}

#[test]
fn barrier_releases_every_rank_once_the_last_arrives() {
    let (_server, addr) = server();
    let results: Vec<_> = thread::scope(|s| {
        let ranks: Vec<_> = (0..3)
            .map(|_| {
                let store = client(&addr);
                s.spawn(move || store.barrier("init", 3, TIMEOUT))
            })
            .collect();
        ranks.into_iter().map(|rank| rank.join().unwrap()).collect()
    });
    for (rank, result) in results.iter().enumerate() {
        assert!(result.is_ok(), "rank {rank} was not released from the barrier: {result:?}");
    }
}

/// Rank 1 waits at a barrier on the busy board while rank 0 writes a
/// checkpoint for three timeouts: it is held, not failed, and released when
/// rank 0 arrives. The save ends at one of the waiting rank's looks at the
/// board on purpose: rank 0 may arrive and stop being busy between that
/// look's timeout and its reading of the board. Once no rank says it is
/// busy, a missing rank fails the wait after one timeout, saying who arrived.
#[test]
fn a_board_barrier_waits_past_the_timeout_only_while_a_rank_is_busy() {
    let (_server, addr) = server();
    let timeout = Duration::from_millis(300);
    let board = |rank| BusyBoard::join(client(&addr), rank, 2).expect("joining the busy board failed");
    let (saving, waiting) = (board(0), board(1));
    saving.say(Some("writing checkpoint step_000100")).unwrap();
    let (saved, waited) = thread::scope(|s| {
        let saved = s.spawn(|| {
            thread::sleep(3 * timeout);
            let arrived = saving.barrier("after the save", 2, timeout);
            saving.say(None).unwrap();
            arrived
        });
        let waited = waiting.barrier("after the save", 2, timeout);
        (saved.join().unwrap(), waited)
    });
    saved.expect("the saving rank's barrier failed");
    waited.expect("the waiting rank failed while the other said it was busy");
    let err = waiting.barrier("nobody busy", 2, timeout).expect_err("a barrier of 2 released 1");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "expected a timeout: {err}");
    assert!(err.to_string().contains("1 of 2"), "the error must say who arrived: {err}");
}

#[test]
fn barrier_with_a_missing_rank_times_out() {
    let (_server, addr) = server();
    let results: Vec<_> = thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|_| {
                let store = client(&addr);
                s.spawn(move || store.barrier("init", 3, Duration::from_millis(200)))
            })
            .collect();
        ranks.into_iter().map(|rank| rank.join().unwrap()).collect()
    });
    for result in results {
        let err = result.expect_err("a barrier for 3 ranks released only 2");
        assert_eq!(err.kind(), ErrorKind::TimedOut, "expected a timeout: {err}");
        assert!(err.to_string().contains("2 of 3"), "the error must say who arrived: {err}");
    }
}

#[test]
fn wrong_token_is_refused_while_the_right_one_is_served() {
    let (_server, addr) = server();
    let err = StoreClient::connect(&addr, "other-job", TIMEOUT).err().expect("a wrong token must be refused");
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "a wrong token must be refused: {err}");
    assert!(err.to_string().contains("WORKBOOK_JOB_TOKEN"), "the error must name the variable: {err}");
    assert_serves(&addr, "refusing a wrong token");
}

/// A process squatting on the store's port never sees the token: it gets a
/// proof bound to its own nonce, and the rank refuses it for knowing nothing.
#[test]
fn a_squatter_on_the_port_learns_nothing_and_is_refused() {
    let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = squatter.local_addr().unwrap().to_string();
    let heard = thread::spawn(move || {
        let (mut rank, _) = squatter.accept().unwrap();
        rank.write_all(&[0; 32]).unwrap(); // a challenge
        let mut answer = vec![0; 64];
        rank.read_exact(&mut answer).unwrap();
        rank.write_all(&[0; 33]).unwrap(); // "accepted", with a made-up proof
        answer
    });
    let err = StoreClient::connect(&addr, TOKEN, TIMEOUT).err().expect("a squatter must not pass for the store");
    let answer = heard.join().unwrap();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("does not know the job token"), "{err}");
    let sent = answer.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes());
    assert!(!sent, "the token itself crossed the wire: {answer:?}");
}

#[test]
fn stray_connections_do_not_disturb_the_store() {
    let (_server, addr) = server();
    // A 4 GiB length prefix and garbage where the handshake's answer belongs:
    // the server must refuse and close this connection, not allocate.
    let mut huge = TcpStream::connect(&addr).unwrap();
    huge.write_all(&[&u32::MAX.to_le_bytes()[..], &[0xAB; 60]].concat()).unwrap();
    // Garbage, then gone.
    TcpStream::connect(&addr).unwrap().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_serves(&addr, "two stray connections");
    huge.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut heard = vec![];
    let read = huge.read_to_end(&mut heard);
    assert!(
        read.is_ok() || read.as_ref().is_err_and(|e| e.kind() == ErrorKind::ConnectionReset),
        "the server must close a connection that fails the handshake, got {read:?}"
    );
    assert!(heard.len() <= 33, "the server said more than a challenge and a refusal: {} bytes", heard.len());
}

#[test]
fn protocol_violation_closes_only_that_connection() {
    let (_server, addr) = server();
    let mut raw = TcpStream::connect(&addr).unwrap();
    raw.set_read_timeout(Some(TIMEOUT)).unwrap();
    auth::dial(&mut raw, TOKEN, Purpose::Store, "the store").expect("the handshake with the right token");
    raw.write_all(&[1, 0, 0, 0, 99]).unwrap(); // a one-byte request with opcode 99
    let read = raw.read(&mut [0; 16]);
    assert!(matches!(read, Ok(0)), "an unknown opcode must close the connection, got {read:?}");
    assert_serves(&addr, "an unknown opcode");
}

/// Strangers that connect and say nothing hold no one up: each waits out
/// its handshake on a thread of its own.
#[test]
fn silent_connections_do_not_delay_the_ranks() {
    let (_server, addr) = server();
    let silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let started = Instant::now();
    assert_serves(&addr, "20 silent connections");
    assert!(started.elapsed() < TIMEOUT, "the store took {:?} to serve a rank", started.elapsed());
    drop(silent);
}

#[test]
fn dropped_server_turns_a_waiting_get_into_an_error() {
    let (server, addr) = server();
    let store = client(&addr);
    let host_exits = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        drop(server);
    });
    let started = Instant::now();
    let err = store.get("never/set", Duration::from_secs(30)).unwrap_err();
    host_exits.join().unwrap();
    assert!(started.elapsed() < TIMEOUT, "get hung for {:?} after the server went", started.elapsed());
    assert!(err.to_string().contains("closed the connection"), "the error must say the host went: {err}");
}

#[test]
fn connect_retries_until_the_server_binds() {
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let host = {
        let addr = addr.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            StoreServer::bind(&addr, TOKEN).expect("binding the freed port failed")
        })
    };
    let store = StoreClient::connect(&addr, TOKEN, TIMEOUT);
    let _server = host.join().unwrap();
    let store = store.expect("connect must retry until the server starts");
    store.set("key", b"v").expect("the late server must serve the early client");
}

/// A rank's mesh listener greets newcomers side by side, each for a short
/// while: a thousand strangers that connect and say nothing, far more than
/// it greets at once, cannot keep the real rank out or hold the job past its
/// start-up, and one with the wrong token is not taken for a rank.
#[test]
fn silent_strangers_on_a_ranks_port_do_not_stall_the_job() {
    use workbook::distributed::{ProcessGroup, ReduceOp, Rendezvous, TcpProcessGroup};
    let master = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let rendezvous = |rank| Rendezvous {
        rank,
        world_size: 2,
        master: master.clone(),
        token: TOKEN.to_string(),
        timeout: Duration::from_secs(30),
    };
    let started = Instant::now();
    let rank = |rank| {
        let pg = TcpProcessGroup::init(&rendezvous(rank)).expect("the job forms");
        let one = candle_core::Tensor::new(&[1f32], &candle_core::Device::Cpu).unwrap();
        pg.all_reduce(&one, ReduceOp::Sum).unwrap().to_vec1::<f32>().unwrap()[0]
    };
    let sums: Vec<f32> = thread::scope(|s| {
        let rank0 = s.spawn(|| rank(0));
        let store = StoreClient::connect(&master, TOKEN, TIMEOUT).unwrap();
        let addr = String::from_utf8(store.get("addr/0", TIMEOUT).unwrap()).unwrap();
        let _silent: Vec<TcpStream> = (0..1000).map(|_| TcpStream::connect(&addr).unwrap()).collect();
        let mut impostor = TcpStream::connect(&addr).unwrap();
        impostor.write_all(b"WBRK\x01\x00\x00\x00").unwrap(); // claims to be rank 1
        impostor.set_read_timeout(Some(TIMEOUT)).unwrap();
        let refused = auth::dial(&mut impostor, "other-job", Purpose::Mesh, "rank 0");
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::PermissionDenied, "a wrong token must be refused");
        let rank1 = s.spawn(|| rank(1));
        [rank0, rank1].map(|r| r.join().unwrap()).to_vec()
    });
    assert!(started.elapsed() < Duration::from_secs(10), "the job took {:?} to form", started.elapsed());
    assert_eq!(sums, [2.0, 2.0]);
}

/// The board on which NCCL's ranks say what long work they are busy with:
/// a watchdog reads the first busy rank, in rank order, and nobody once
/// they are done; a rank that never joined counts as not busy.
#[test]
fn the_busy_board_tells_a_watchdog_who_is_busy() {
    use workbook::distributed::BusyBoard;
    let (_server, addr) = server();
    let boards: Vec<BusyBoard> = (0..2).map(|rank| BusyBoard::join(client(&addr), rank, 3).unwrap()).collect();
    assert_eq!(boards[0].anyone_busy(), None, "nobody is busy yet (rank 2 never joined)");
    boards[1].say(Some("writing a checkpoint")).unwrap();
    assert_eq!(boards[0].anyone_busy().as_deref(), Some("rank 1: writing a checkpoint"));
    boards[1].say(None).unwrap();
    assert_eq!(boards[0].anyone_busy(), None, "rank 1 is done");
}
