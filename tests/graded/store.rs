//! Ungraded checks of the rendezvous store (`workbook::distributed::store`):
//! what ranks exchange through it, and that nothing a stray connection or a
//! dead host does turns into a crash or a hang.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use workbook::distributed::store::{StoreClient, StoreServer};

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
    let intruder = StoreClient::connect(&addr, "other-job", TIMEOUT).unwrap();
    let err = intruder.set("key", b"value").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "a wrong token must be refused: {err}");
    assert!(err.to_string().contains("WORKBOOK_JOB_TOKEN"), "the error must name the variable: {err}");
    assert_serves(&addr, "refusing a wrong token");
}

#[test]
fn stray_connections_do_not_disturb_the_store() {
    let (_server, addr) = server();
    // A 4 GiB length prefix: the server must close this connection, not allocate.
    let mut huge = TcpStream::connect(&addr).unwrap();
    huge.write_all(&u32::MAX.to_le_bytes()).unwrap();
    // Garbage, then gone.
    TcpStream::connect(&addr).unwrap().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert_serves(&addr, "two stray connections");
    huge.set_read_timeout(Some(TIMEOUT)).unwrap();
    let read = huge.read(&mut [0; 16]);
    assert!(
        matches!(read, Ok(0)) || read.as_ref().is_err_and(|e| e.kind() == ErrorKind::ConnectionReset),
        "the server must close a connection announcing a 4 GiB frame, got {read:?}"
    );
}

#[test]
fn protocol_violation_closes_only_that_connection() {
    let (_server, addr) = server();
    let mut raw = TcpStream::connect(&addr).unwrap();
    let token = [&(TOKEN.len() as u32).to_le_bytes()[..], TOKEN.as_bytes()].concat();
    raw.write_all(&token).unwrap();
    raw.write_all(&[1, 0, 0, 0, 99]).unwrap(); // a one-byte request with opcode 99
    raw.set_read_timeout(Some(TIMEOUT)).unwrap();
    let read = raw.read(&mut [0; 16]);
    assert!(matches!(read, Ok(0)), "an unknown opcode must close the connection, got {read:?}");
    assert_serves(&addr, "an unknown opcode");
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
