//! A private RabbitMQ node (3.10) a test may kill (SIGKILL), start again
//! on the same ports and data, and make close its clients' connections;
//! beside the machine's own broker on 5672, which it never touches.
//!
//! A start, from the script to `await_startup`, took 4.6-4.9 s here alone
//! (2 cores), 6-7.5 s beside a cargo build or a second node's start; a
//! restart on the same data as long; a kill about 25 ms.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    helpers::free_port,
    support::proc_tree::{alive, comm, descendants},
};

/// The broker's own start script. Not `/usr/sbin/rabbitmq-server`: that
/// wrapper, run as root, starts the node as the `rabbitmq` user with its
/// output in `/var/log/rabbitmq`, and refuses any other user.
const SCRIPTS: &str = "/usr/lib/rabbitmq/bin";
/// How long a start may take before the test gives up on it.
const BOOT_LIMIT: Duration = Duration::from_secs(90);

pub struct OwnRabbit {
    /// Its data (`mnesia`), logs, configuration and `HOME` (the Erlang
    /// cookie its first start makes, which `rabbitmqctl` reads).
    dir: PathBuf,
    node: String,
    port: u16,
    dist_port: u16,
    /// The `rabbitmq-server` script: a shell whose child is the Erlang VM
    /// (`beam.smp`); it waits for the VM and ends with it.
    script: Option<Child>,
}

impl OwnRabbit {
    /// A fresh node on free ports (AMQP and Erlang distribution), booted.
    pub async fn start() -> Self {
        let port = free_port();
        let mut dist_port = free_port();
        while dist_port == port {
            dist_port = free_port();
        }
        let dir = std::env::temp_dir().join(format!(
            "filedock-own-rabbit-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(dir.join("home")).unwrap();
        // No plugins (the management plugin would take port 15672), no
        // configuration of the machine's broker (/etc/rabbitmq names its
        // node and its listener on 5672).
        std::fs::write(dir.join("enabled_plugins"), "").unwrap();
        std::fs::write(dir.join("rabbitmq-env.conf"), "").unwrap();
        std::fs::write(
            dir.join("rabbitmq.conf"),
            format!("listeners.tcp.default = 127.0.0.1:{port}\n"),
        )
        .unwrap();
        let mut own = Self {
            dir,
            node: format!("filedock-{port}@localhost"),
            port,
            dist_port,
            script: None,
        };
        own.restart().await;
        own
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f` (guest may log in from loopback).
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node's name, for `rabbitmqctl -n`.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// What both the server and `rabbitmqctl` need.
    fn common_env(&self) -> Vec<(&'static str, String)> {
        let path = |name: &str| self.dir.join(name).display().to_string();
        vec![
            ("HOME", path("home")),
            ("RABBITMQ_CONF_ENV_FILE", path("rabbitmq-env.conf")),
            ("RABBITMQ_NODENAME", self.node.clone()),
        ]
    }

    fn server_env(&self) -> Vec<(&'static str, String)> {
        let path = |name: &str| self.dir.join(name).display().to_string();
        let mut env = self.common_env();
        env.extend([
            ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1".into()),
            ("RABBITMQ_NODE_PORT", self.port.to_string()),
            // Its default, the AMQP port + 20000, may be taken.
            ("RABBITMQ_DIST_PORT", self.dist_port.to_string()),
            ("RABBITMQ_MNESIA_BASE", path("mnesia")),
            ("RABBITMQ_LOG_BASE", path("log")),
            ("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins")),
            ("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf")),
            (
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}".into(),
            ),
        ]);
        env
    }

    /// Starts the node on its ports and data and waits until it is booted:
    /// its AMQP port accepts and `rabbitmqctl await_startup` says so.
    pub async fn restart(&mut self) {
        if self.script.is_some() {
            self.kill();
        }
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .unwrap();
        let script = Command::new(Path::new(SCRIPTS).join("rabbitmq-server"))
            .envs(self.server_env())
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("rabbitmq-server (apt-get install rabbitmq-server)");
        self.script = Some(script);
        let deadline = Instant::now() + BOOT_LIMIT;
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            if let Some(status) = self.script.as_mut().unwrap().try_wait().unwrap() {
                self.script = None;
                panic!("{} ended ({status}): {}", self.node, self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not listen: {}",
                self.node,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (ok, out) = self.ctl(&["await_startup", "--timeout", "60"]).await;
        assert!(ok, "{} did not boot: {out}", self.node);
    }

    /// SIGKILLs the node's VM (and whatever else the script started), and
    /// waits until every one of them is gone.
    pub fn kill(&mut self) {
        if let Err(e) = self.kill_tree() {
            panic!("{e}");
        }
    }

    /// As [`Self::kill`]; what outlived it, as an error.
    fn kill_tree(&mut self) -> Result<(), String> {
        let Some(mut script) = self.script.take() else {
            return Ok(());
        };
        let script_pid = script.id() as i32;
        let tree = descendants(script_pid);
        // The VM first: the script's `wait` then returns and it exits.
        let (vms, rest): (Vec<i32>, Vec<i32>) = tree
            .iter()
            .partition(|&&p| comm(p).as_deref() == Some("beam.smp"));
        for pid in vms.iter().chain(&rest) {
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while script.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = script.kill();
        let _ = script.wait();
        let deadline = Instant::now() + Duration::from_secs(10);
        while tree.iter().any(|&p| alive(p)) {
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: processes {tree:?} outlived SIGKILL",
                    self.node
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// `rabbitmqctl close_all_connections`: the broker closes every client
    /// connection (a consumer's mid-delivery among them). How many it closed.
    pub async fn close_connections(&self) -> usize {
        let (ok, out) = self
            .ctl(&["close_all_connections", "--global", "test"])
            .await;
        if !ok {
            return 0;
        }
        // "Closed 3 connections"
        out.lines()
            .find_map(|l| l.strip_prefix("Closed ")?.split(' ').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Sets off a memory alarm (the high watermark at 0: the node blocks
    /// every connection that publishes), or clears it (`false`: the
    /// default watermark again).
    pub async fn memory_alarm(&self, on: bool) {
        let watermark = if on { "0" } else { "0.4" };
        let (ok, out) = self.ctl(&["set_vm_memory_high_watermark", watermark]).await;
        assert!(ok, "rabbitmqctl set_vm_memory_high_watermark: {out}");
    }

    /// How many client connections the node holds blocked (an alarm's).
    pub async fn blocked_connections(&self) -> usize {
        self.connection_states()
            .await
            .iter()
            .filter(|s| *s == "blocked")
            .count()
    }

    /// The state of each client connection the node holds (`running`,
    /// `blocking`, `blocked`...).
    pub async fn connection_states(&self) -> Vec<String> {
        let (ok, out) = self.ctl(&["list_connections", "-s", "state"]).await;
        assert!(ok, "rabbitmqctl list_connections: {out}");
        out.lines().map(|l| l.trim().to_owned()).collect()
    }

    /// Deliveries the node's queues hold unacknowledged, in all.
    pub async fn unacknowledged(&self) -> u64 {
        let (ok, out) = self
            .ctl(&["list_queues", "-s", "name", "messages_unacknowledged"])
            .await;
        assert!(ok, "rabbitmqctl list_queues: {out}");
        out.lines()
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum()
    }

    /// Runs `rabbitmqctl -n NODE ARGS` (90 s at most): whether it succeeded,
    /// and what it printed.
    pub async fn ctl(&self, args: &[&str]) -> (bool, String) {
        let run = tokio::process::Command::new(Path::new(SCRIPTS).join("rabbitmqctl"))
            .envs(self.common_env())
            .current_dir(&self.dir)
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        match tokio::time::timeout(Duration::from_secs(90), run).await {
            Ok(Ok(out)) => {
                let text = String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr);
                (out.status.success(), text)
            }
            Ok(Err(e)) => (false, format!("rabbitmqctl: {e}")),
            Err(_) => (false, "rabbitmqctl took over 90 s".into()),
        }
    }

    /// The end of the script's output and of the node's log.
    fn log_tail(&self) -> String {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let log = read(self.dir.join("log").join(format!("{}.log", self.node)));
        let out = read(self.dir.join("server.log"));
        let tail = |s: &str| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        };
        format!("{}\n{}", tail(&out), tail(&log))
    }
}

impl Drop for OwnRabbit {
    fn drop(&mut self) {
        // No panic here: the test may be unwinding from one.
        if let Err(e) = self.kill_tree() {
            eprintln!("{e}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the server on `port` answers AMQP 0-9-1's protocol header
/// with `connection.start` (a method frame on channel 0, class 10 method 10).
async fn speaks_amqp(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut tcp) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let mut frame = [0u8; 11];
    let answered = async {
        tcp.write_all(b"AMQP\x00\x00\x09\x01").await?;
        tcp.read_exact(&mut frame).await
    };
    let read = tokio::time::timeout(Duration::from_secs(5), answered).await;
    matches!(read, Ok(Ok(_))) && frame[..3] == [1, 0, 0] && frame[7..] == [0, 10, 0, 10]
}

/// The node starts, takes AMQP connections, dies for good on `kill`, and
/// boots again on its ports and data (real-servers pass only: it needs
/// `rabbitmq-server`).
#[tokio::test]
async fn own_rabbit_starts_dies_and_restarts() {
    if !crate::helpers::real_backends() {
        return;
    }
    let started = Instant::now();
    let mut own = OwnRabbit::start().await;
    let boot = started.elapsed();
    let vm = descendants(own.script.as_ref().unwrap().id() as i32)
        .into_iter()
        .find(|&p| comm(p).as_deref() == Some("beam.smp"))
        .expect("a beam.smp under the script");
    assert!(
        speaks_amqp(own.port()).await,
        "{} does not answer AMQP",
        own.url()
    );
    let (ok, out) = own.ctl(&["list_connections"]).await;
    assert!(ok, "rabbitmqctl: {out}");
    let killing = Instant::now();
    own.kill();
    let killed = killing.elapsed();
    assert!(!alive(vm), "beam.smp {vm} outlived kill");
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", own.port()))
            .await
            .is_err(),
        "the port still accepts after kill"
    );
    let restarted = Instant::now();
    own.restart().await;
    eprintln!(
        "own rabbit {}: started in {:?}, killed in {:?}, restarted in {:?}",
        own.node(),
        boot,
        killed,
        restarted.elapsed()
    );
    let dir = own.dir.clone();
    drop(own);
    assert!(!dir.exists());
}

/// What the nemesis's RabbitMQ faults rely on, against a real client
/// (lapin): a publish through the fault proxy trips the cut armed for
/// `basic.publish`, and the broker closes a client's connection when told.
#[tokio::test]
async fn a_publish_trips_the_armed_cut_and_the_broker_closes_connections() {
    use lapin::{BasicProperties, Connection, ConnectionProperties, options::BasicPublishOptions};

    use crate::support::{fault_proxy::FaultProxy, nemesis::BASIC_PUBLISH};

    if !crate::helpers::real_backends() {
        return;
    }
    let own = OwnRabbit::start().await;
    let proxy = FaultProxy::start(([127, 0, 0, 1], own.port()).into()).await;
    let url = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let proxied = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = proxied.create_channel().await.unwrap();
    proxy.cut_after(BASIC_PUBLISH, Duration::from_millis(200));
    // To the default exchange: no queue need exist.
    let _ = channel
        .basic_publish(
            "".into(),
            "nowhere".into(),
            BasicPublishOptions::default(),
            b"{}",
            BasicProperties::default(),
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !proxy.triggered() {
        assert!(
            Instant::now() < deadline,
            "the publish did not trip the cut"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let direct = Connection::connect(&own.url(), ConnectionProperties::default())
        .await
        .unwrap();
    assert!(own.close_connections().await >= 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while direct.status().connected() {
        assert!(Instant::now() < deadline, "the connection stayed open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
