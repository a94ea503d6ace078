//! Bounded fuzzing of certificate identity extraction (`certificate.rs`): proptest in place of
//! `cargo fuzz`, so that every `cargo test` run (CI included) fuzzes for a bounded time.
//!
//! Three generators feed one oracle ([`check`]): arbitrary bytes; real certificates made by rcgen
//! (one, two or no CNs of every directory string type, SANs, a CA-signed leaf) with random mutations,
//! some aimed at the CN attribute's tag and bytes; and certificates built from generated subjects,
//! whose exact identity is known in advance.
//!
//! `KEYWARD_FUZZ_CASES=N` runs N cases per property instead of the defaults (chosen so that the three
//! take a few seconds together in a debug build). Failing inputs are kept by proptest in
//! `proptest-regressions/identity/certificate_fuzz.txt` and replayed first on every run.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Mutex, OnceLock};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rcgen::string::{BmpString, Ia5String, PrintableString, TeletexString, UniversalString};
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue, IsCa, Issuer, KeyPair, SanType};
use rustls_pki_types::CertificateDer;
use x509_parser::asn1_rs::Tag;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::certificate::{cert_names, NoIdentity, PeerIdentity};

/// Runs `test` on `KEYWARD_FUZZ_CASES` (else `default_cases`) values of `strategy`, failures persisted
/// in `proptest-regressions/identity/certificate_fuzz.txt` and replayed first; a panic is a failure. Prints
/// how the cases ended (the label each returned), which shows the run reached the interesting outcomes.
fn fuzz<S: Strategy>(
    name: &str,
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<&'static str, TestCaseError>,
) {
    let cases = std::env::var("KEYWARD_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    let mut runner = TestRunner::new(Config { cases, source_file: Some(file!()), ..Config::default() });
    let tally = Mutex::new(BTreeMap::<&'static str, u64>::new());
    let result = runner.run(&strategy, |value| {
        let label = test(value)?;
        *tally.lock().unwrap_or_else(|e| e.into_inner()).entry(label).or_default() += 1;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    let tally = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    eprintln!("fuzz {name}: {} cases passed: {tally:?}", tally.values().sum::<u64>());
}

// ---------------------------------------------------------------------------
// the oracle
// ---------------------------------------------------------------------------

/// What every input must satisfy: no panic; a certificate that does not parse has no names (the
/// listener refuses it); one that parses has one entry per CN attribute (counted independently),
/// each readable CN equal to its attribute's bytes decoded (checked by re-encoding), and the identity
/// the rules give for that list.
fn check(der: &[u8]) -> Result<&'static str, TestCaseError> {
    let Some(names) = cert_names(&CertificateDer::from(der)) else {
        return Ok("not a certificate");
    };
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let attributes: Vec<_> = cert.subject().iter_common_name().collect();
    prop_assert_eq!(names.common_names.len(), attributes.len(), "one entry per CN attribute");
    for (name, attr) in names.common_names.iter().zip(&attributes) {
        if let Some(text) = name {
            let value = attr.attr_value();
            prop_assert!(
                encodes_to(value.tag(), text, value.data),
                "CN {:?} is not the text of its {:?} bytes {:?}",
                text,
                value.tag(),
                value.data
            );
        }
    }
    let label = match PeerIdentity::from_names(&names) {
        PeerIdentity::Cert { common_name } => {
            prop_assert!(!common_name.is_empty());
            prop_assert_eq!(&names.common_names, &vec![Some(common_name)]);
            "identity"
        }
        PeerIdentity::None(NoIdentity::NoCommonName) => {
            prop_assert!(names.common_names.is_empty() || names.common_names == [Some(String::new())]);
            "no CN"
        }
        PeerIdentity::None(NoIdentity::SeveralCommonNames) => {
            prop_assert!(names.common_names.len() >= 2);
            "several CNs"
        }
        PeerIdentity::None(NoIdentity::UnreadableCommonName) => {
            prop_assert_eq!(&names.common_names, &vec![None]);
            "unreadable CN"
        }
        PeerIdentity::None(other) => return Err(TestCaseError::fail(format!("a certificate gave {other:?}"))),
    };
    Ok(label)
}

/// Whether `text` encoded as a `tag` directory string is `bytes` (a BMPString may carry one
/// trailing NUL character that the text drops).
fn encodes_to(tag: Tag, text: &str, bytes: &[u8]) -> bool {
    match tag {
        Tag::Utf8String | Tag::PrintableString | Tag::Ia5String | Tag::NumericString => text.as_bytes() == bytes,
        Tag::BmpString => {
            let encoded: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
            encoded == bytes || [&encoded[..], &[0, 0]].concat() == bytes
        }
        Tag::TeletexString => text.chars().map(u32::from).eq(bytes.iter().map(|&b| u32::from(b))),
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// real certificates to mutate
// ---------------------------------------------------------------------------

/// The Common Name OID as a custom attribute type: rcgen keeps one value per `DnType`, so this is how
/// a second CN gets into a subject.
fn second_cn() -> DnType {
    DnType::CustomDnType(vec![2, 5, 4, 3])
}

fn key() -> &'static KeyPair {
    static KEY: OnceLock<KeyPair> = OnceLock::new();
    KEY.get_or_init(|| KeyPair::generate().expect("key pair"))
}

fn self_signed(subject: &[(DnType, DnValue)], sans: Vec<SanType>) -> Vec<u8> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    for (ty, value) in subject {
        dn.push(ty.clone(), value.clone());
    }
    params.distinguished_name = dn;
    params.subject_alt_names = sans;
    params.self_signed(key()).expect("self-sign").der().to_vec()
}

/// rcgen-made certificates covering what identity extraction distinguishes.
fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let utf8 = |s: &str| DnValue::Utf8String(s.into());
        let dns = |s: &str| SanType::DnsName(Ia5String::try_from(s).unwrap());
        let ip = |s: &str| SanType::IpAddress(s.parse::<IpAddr>().unwrap());
        let cn = DnType::CommonName;
        let mut seeds = vec![
            self_signed(&[(cn.clone(), utf8("alice"))], vec![dns("alice.example"), ip("10.0.0.1"), ip("::1")]),
            self_signed(&[], vec![dns("no-cn.example")]),
            self_signed(&[(DnType::OrganizationName, utf8("org only"))], vec![]),
            self_signed(&[(cn.clone(), DnValue::BmpString(BmpString::try_from("bøb").unwrap()))], vec![]),
            self_signed(&[(cn.clone(), DnValue::PrintableString(PrintableString::try_from("carol").unwrap()))], vec![]),
            self_signed(&[(cn.clone(), DnValue::TeletexString(TeletexString::try_from("dave").unwrap()))], vec![]),
            self_signed(&[(cn.clone(), DnValue::UniversalString(UniversalString::try_from("eve").unwrap()))], vec![]),
            self_signed(&[(cn.clone(), DnValue::Ia5String(Ia5String::try_from("frank").unwrap()))], vec![]),
            self_signed(&[(cn.clone(), utf8(""))], vec![]),
            self_signed(&[(cn.clone(), utf8(&"x".repeat(600)))], vec![]),
            self_signed(
                &[
                    (cn.clone(), utf8("grace")),
                    (second_cn(), DnValue::BmpString(BmpString::try_from("heidi").unwrap())),
                ],
                vec![],
            ),
            self_signed(
                &[
                    (DnType::OrganizationName, utf8("o")),
                    (cn.clone(), DnValue::PrintableString(PrintableString::try_from("ivan").unwrap())),
                    (DnType::OrganizationalUnitName, utf8("ou")),
                    (second_cn(), utf8("judy")),
                ],
                vec![SanType::Rfc822Name(Ia5String::try_from("judy@example.com").unwrap())],
            ),
        ];
        // a leaf signed by a CA, as the listener sees them
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(cn.clone(), "fuzz CA");
        let ca_key = KeyPair::generate().expect("CA key");
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(vec!["leaf.example".to_string()]).expect("leaf params");
        leaf.distinguished_name.push(cn, "mallory");
        seeds.push(leaf.signed_by(key(), &issuer).expect("sign leaf").der().to_vec());
        seeds
    })
}

/// Where each CN attribute's value starts in `der`: just after the CN OID (06 03 55 04 03), at the
/// value's tag byte.
fn cn_value_offsets(der: &[u8]) -> Vec<usize> {
    const CN_OID: [u8; 5] = [0x06, 0x03, 0x55, 0x04, 0x03];
    der.windows(CN_OID.len())
        .enumerate()
        .filter(|(_, w)| *w == CN_OID)
        .map(|(i, _)| i + CN_OID.len())
        .filter(|&value| value < der.len())
        .collect()
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Set {
        at: usize,
        byte: u8,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Remove {
        at: usize,
        len: usize,
    },
    Truncate {
        len: usize,
    },
    Duplicate {
        from: usize,
        len: usize,
        to: usize,
    },
    /// Replace the tag of the `which`-th CN value (directory string types, and some that are not).
    CnTag {
        which: usize,
        tag: u8,
    },
    /// Overwrite a byte inside the `which`-th CN value (keeping its length).
    CnByte {
        which: usize,
        at: usize,
        byte: u8,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let tags = prop::sample::select(vec![0x0c, 0x12, 0x13, 0x14, 0x16, 0x1c, 0x1e, 0x04, 0x02, 0x05, 0x30, 0x1a, 0xff]);
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), 1usize..16).prop_map(|(at, len)| Mutation::Remove { at, len }),
        any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        (any::<usize>(), 1usize..64, any::<usize>()).prop_map(|(from, len, to)| Mutation::Duplicate { from, len, to }),
        (any::<usize>(), tags).prop_map(|(which, tag)| Mutation::CnTag { which, tag }),
        (any::<usize>(), any::<usize>(), any::<u8>()).prop_map(|(which, at, byte)| Mutation::CnByte {
            which,
            at,
            byte
        }),
    ]
}

fn apply(der: &mut Vec<u8>, m: &Mutation) {
    if der.is_empty() {
        return;
    }
    let len = der.len();
    match m {
        Mutation::Flip { at, bit } => der[at % len] ^= 1 << bit,
        Mutation::Set { at, byte } => der[at % len] = *byte,
        Mutation::Insert { at, bytes } => {
            let at = at % (len + 1);
            der.splice(at..at, bytes.iter().copied());
        }
        Mutation::Remove { at, len: n } => {
            let at = at % len;
            der.drain(at..(at + n).min(len));
        }
        Mutation::Truncate { len: n } => der.truncate(n % len),
        Mutation::Duplicate { from, len: n, to } => {
            let from = from % len;
            let slice = der[from..(from + n).min(len)].to_vec();
            let to = to % (len + 1);
            der.splice(to..to, slice);
        }
        Mutation::CnTag { which, tag } => {
            let offsets = cn_value_offsets(der);
            if !offsets.is_empty() {
                der[offsets[which % offsets.len()]] = *tag;
            }
        }
        Mutation::CnByte { which, at, byte } => {
            let offsets = cn_value_offsets(der);
            if let Some(&start) = offsets.get(which % offsets.len().max(1)) {
                // tag, one length byte (short form: the seeds' CNs are under 128 bytes, or the long
                // one, whose bytes are just as good to overwrite), then the value
                let value_len = usize::from(*der.get(start + 1).unwrap_or(&0) & 0x7f).max(1);
                let i = start + 2 + at % value_len;
                if i < der.len() {
                    der[i] = *byte;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// generated subjects with a known identity
// ---------------------------------------------------------------------------

/// One CN of a generated subject: its value, and the text identity extraction must read from it
/// (`None`: unreadable).
#[derive(Clone, Debug)]
struct GeneratedCn {
    value: DnValue,
    text: Option<String>,
}

fn generated_cn() -> impl Strategy<Value = GeneratedCn> {
    // rcgen takes BMP characters below U+FFFF
    let bmp_char = any::<char>().prop_filter("in the BMP", |c| (*c as u32) < 0xffff);
    prop_oneof![
        any::<String>().prop_map(|s| GeneratedCn { text: Some(s.clone()), value: DnValue::Utf8String(s) }),
        "[A-Za-z0-9 '()+,./:=-]{0,24}".prop_map(|s| GeneratedCn {
            text: Some(s.clone()),
            value: DnValue::PrintableString(PrintableString::try_from(s).unwrap())
        }),
        "[\\x00-\\x7f]{0,24}".prop_map(|s| GeneratedCn {
            text: Some(s.clone()),
            value: DnValue::Ia5String(Ia5String::try_from(s).unwrap())
        }),
        "[\\x20-\\x7f]{0,24}".prop_map(|s| GeneratedCn {
            text: Some(s.clone()),
            value: DnValue::TeletexString(TeletexString::try_from(s).unwrap())
        }),
        prop::collection::vec(bmp_char, 0..24).prop_map(|chars| {
            let s: String = chars.into_iter().collect();
            // one trailing NUL is a terminator, as in Go
            let text = s.strip_suffix('\0').unwrap_or(&s).to_string();
            GeneratedCn { text: Some(text), value: DnValue::BmpString(BmpString::try_from(s).unwrap()) }
        }),
        any::<String>().prop_map(|s| GeneratedCn {
            text: None,
            value: DnValue::UniversalString(UniversalString::try_from(s).unwrap())
        }),
    ]
}

fn generated_san() -> impl Strategy<Value = (SanType, Option<String>)> {
    prop_oneof![
        "[a-z0-9-]{1,12}(\\.[a-z0-9-]{1,12}){0,2}"
            .prop_map(|s| (SanType::DnsName(Ia5String::try_from(s.clone()).unwrap()), Some(s))),
        any::<[u8; 4]>().prop_map(|b| {
            let ip = IpAddr::from(b);
            (SanType::IpAddress(ip), Some(ip.to_string()))
        }),
        any::<[u8; 16]>().prop_map(|b| {
            let ip = IpAddr::from(b);
            (SanType::IpAddress(ip), Some(ip.to_string()))
        }),
        "[a-z]{1,8}@[a-z]{1,8}\\.example".prop_map(|s| (SanType::Rfc822Name(Ia5String::try_from(s).unwrap()), None)),
    ]
}

/// Arbitrary bytes: no panic, and whatever parses obeys the rules.
#[test]
fn arbitrary_bytes() {
    fuzz("arbitrary bytes", 20_000, prop::collection::vec(any::<u8>(), 0..2048), |der| check(&der));
}

/// Mutated real certificates: no panic, and whatever still parses obeys the rules.
#[test]
fn mutated_certificates() {
    let strategy = (any::<prop::sample::Index>(), prop::collection::vec(mutation(), 1..6));
    fuzz("mutated certificates", 20_000, strategy, |(seed, mutations)| {
        let seeds = seeds();
        let mut der = seeds[seed.index(seeds.len())].clone();
        for m in &mutations {
            apply(&mut der, m);
        }
        check(&der)
    });
}

/// Certificates with generated subjects (up to two CNs of any directory string type, another
/// attribute before them) and SANs: exactly the identity and host names they should give.
#[test]
fn generated_subjects() {
    let strategy = (
        prop::collection::vec(generated_cn(), 0..=2),
        prop::option::of("[a-z ]{1,12}"),
        prop::collection::vec(generated_san(), 0..4),
    );
    fuzz("generated subjects", 1_000, strategy, |(cns, organization, sans)| {
        let mut subject = Vec::new();
        if let Some(o) = organization {
            subject.push((DnType::OrganizationName, DnValue::Utf8String(o)));
        }
        for (i, cn) in cns.iter().enumerate() {
            subject.push((if i == 0 { DnType::CommonName } else { second_cn() }, cn.value.clone()));
        }
        let der = self_signed(&subject, sans.iter().map(|(san, _)| san.clone()).collect());
        let label = check(&der)?;

        let names = cert_names(&CertificateDer::from(der.as_slice())).expect("an rcgen certificate parses");
        let texts: Vec<Option<String>> = cns.iter().map(|cn| cn.text.clone()).collect();
        prop_assert_eq!(&names.common_names, &texts);
        let hosts: Vec<String> = sans.iter().filter_map(|(_, host)| host.clone()).collect();
        prop_assert_eq!(&names.san_hosts, &hosts);
        let expected = match texts.as_slice() {
            [Some(cn)] if !cn.is_empty() => PeerIdentity::Cert { common_name: cn.clone() },
            [] | [Some(_)] => PeerIdentity::None(NoIdentity::NoCommonName),
            [None] => PeerIdentity::None(NoIdentity::UnreadableCommonName),
            _ => PeerIdentity::None(NoIdentity::SeveralCommonNames),
        };
        prop_assert_eq!(PeerIdentity::from_names(&names), expected);
        Ok(label)
    });
}
