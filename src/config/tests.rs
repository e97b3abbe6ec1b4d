//! The settings' tests: defaults, errors, older names, the variables check.

use super::*;

#[test]
fn help_lists_every_setting_the_server_reads() {
    let read = std::cell::RefCell::new(Vec::<String>::new());
    // Values for the few settings that open others (S3's endpoint and keys).
    let _ = Settings::from_lookup(|name| {
        read.borrow_mut().push(name.to_owned());
        name.starts_with("FILEDOCK_S3_")
            .then(|| name.ends_with("ENDPOINT") || name.ends_with("_KEY"))
            .filter(|&v| v)
            .map(|_| "x".to_owned())
    });
    let listed: Vec<&str> = SETTINGS.iter().map(|s| s.var).collect();
    let missing: Vec<_> = read
        .borrow()
        .iter()
        .filter(|n| !listed.contains(&n.as_str()))
        .cloned()
        .collect();
    assert!(missing.is_empty(), "read but not in --help: {missing:?}");
    assert!(read.borrow().len() > 30, "the S3 settings were read too");
}

#[test]
fn defaults_match_the_design() {
    let s = Settings::from_lookup(|_| None).unwrap();
    assert_eq!(s.bind, "127.0.0.1:8080");
    assert_eq!(s.data_dir, PathBuf::from("./data"));
    assert_eq!(s.lock.strategy, LockStrategy::Notify);
    assert_eq!(s.lock.scope, LockScope::Commit);
    assert_eq!(s.txn_retry.max_attempts, 3);
    assert_eq!(s.max_upload_bytes, 10 << 30);
    assert_eq!(s.sweep.intent_grace, Duration::from_secs(6 * 3600));
    assert_eq!(s.max_connections, 768);
    assert!(s.s3.is_none() && s.mongodb_uri.is_none() && s.redis_url.is_none());
    let with_s3 = Settings::from_lookup(|n| match n {
        "FILEDOCK_S3_ENDPOINT" => Some("http://127.0.0.1:9000".into()),
        "FILEDOCK_S3_ACCESS_KEY" | "FILEDOCK_S3_SECRET_KEY" => Some("k".into()),
        _ => None,
    })
    .unwrap();
    let s3 = with_s3.s3.unwrap();
    assert_eq!(
        (s3.bucket.as_str(), s3.region.as_str()),
        ("filedock", "us-east-1")
    );
    assert_eq!((s3.part_size, s3.part_concurrency), (8 << 20, 4));
    assert!(s3.create_bucket && s3.key_prefix.is_empty());
}

#[test]
fn a_default_is_written_once_and_help_shows_it() {
    for setting in SETTINGS {
        let shown = setting.shown_default();
        assert!(!shown.is_empty(), "{} shows no default", setting.var);
    }
    let embedded = Settings::embedded("/tmp/x");
    assert_eq!(embedded.data_dir, PathBuf::from("/tmp/x"));
    assert_eq!(embedded.bind, default_of("BIND").unwrap());
}

#[test]
fn a_typo_stops_production_and_a_typo_of_the_mode_stops_any_mode() {
    let names = |n: &[&str]| n.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let development = Settings::from_lookup(|_| None).unwrap();
    let production =
        Settings::from_lookup(|n| (n == "FILEDOCK_ENV").then(|| "production".into())).unwrap();
    let typo = names(&["FILEDOCK_REDIS_MOD"]);
    let warned = development.check_variables(typo.clone()).unwrap();
    assert_eq!(warned[0].closest, Some("FILEDOCK_REDIS_MODE"));
    let err = production.check_variables(typo).unwrap_err().to_string();
    assert!(err.contains("did you mean FILEDOCK_REDIS_MODE?"), "{err}");
    let err = development
        .check_variables(names(&["FILEDOCK_EVN"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("did you mean FILEDOCK_ENV?"), "{err}");
    // Near no setting (a newer version's, rolled back from): a warning.
    let far = names(&["FILEDOCK_COLOUR_SCHEME"]);
    assert_eq!(production.check_variables(far).unwrap().len(), 1);
}

#[test]
fn a_renamed_setting_is_read_by_its_older_name_when_the_newer_is_unset() {
    let drain = |vars: &[(&str, &str)]| {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(|n| vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()))
            .unwrap()
            .drain
    };
    assert_eq!(drain(&[]), Duration::from_secs(30));
    let older = ("FILEDOCK_SHUTDOWN_GRACE_SECS", "3");
    assert_eq!(drain(&[older]), Duration::from_secs(3));
    let newer = ("FILEDOCK_DRAIN_SECS", "7");
    assert_eq!(drain(&[older, newer]), Duration::from_secs(7));
}

#[test]
fn bad_values_are_named_in_the_error() {
    let err = Settings::from_lookup(|n| (n == "FILEDOCK_LOCK_SCOPE").then(|| "sometimes".into()))
        .unwrap_err();
    assert!(err.to_string().contains("FILEDOCK_LOCK_SCOPE"), "{err}");
    // A typo is refused at start-up, not silently taken for text logs.
    let err =
        Settings::from_lookup(|n| (n == "FILEDOCK_LOG_FORMAT").then(|| "jsno".into())).unwrap_err();
    assert!(err.to_string().contains("FILEDOCK_LOG_FORMAT"), "{err}");
    // A negative duration is refused at start-up too (it panicked).
    let err = Settings::from_lookup(|n| (n == "FILEDOCK_LOCK_TTL_SECS").then(|| "-1".into()))
        .unwrap_err();
    assert!(err.to_string().contains("FILEDOCK_LOCK_TTL_SECS"), "{err}");
}

#[test]
fn queue_mode_on_rabbitmq_needs_its_url_and_redis_and_no_expiry_in_production() {
    let with = |pairs: &[(&str, &str)]| {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (format!("FILEDOCK_{k}"), v.to_string()))
            .collect();
        Settings::from_lookup(move |n| pairs.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone()))
    };
    let queue = [("COORDINATION", "queue"), ("QUEUE_BROKER", "rabbitmq")];
    let url = ("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f");
    let redis = ("REDIS_URL", "redis://127.0.0.1:6379/");
    let err = with(&[queue[0], queue[1], redis]).unwrap_err().to_string();
    assert!(err.contains("FILEDOCK_AMQP_URL"), "{err}");
    let err = with(&[queue[0], queue[1], url]).unwrap_err().to_string();
    assert!(err.contains("FILEDOCK_REDIS_URL"), "{err}");
    let s = with(&[queue[0], queue[1], url, redis]).unwrap();
    assert_eq!(s.queue_broker, QueueBroker::Rabbitmq);
    assert_eq!(s.amqp_reply_to, AmqpReplyTo::Direct);
    // In lock mode the broker is not used: nothing more is needed.
    assert!(with(&[("QUEUE_BROKER", "rabbitmq")]).is_ok());
    let expiry = ("AMQP_QUEUE_EXPIRY_SECS", "60");
    assert!(with(&[queue[0], queue[1], url, redis, expiry]).is_ok());
    let production = [
        queue[0],
        queue[1],
        url,
        redis,
        expiry,
        ("ENV", "production"),
    ];
    let err = with(&production).unwrap_err().to_string();
    assert!(err.contains("FILEDOCK_AMQP_QUEUE_EXPIRY_SECS"), "{err}");
    let err = with(&[("QUEUE_BROKER", "kafka")]).unwrap_err().to_string();
    assert!(err.contains("redis or rabbitmq"), "{err}");
}
