"""Client properties files and JAAS configs whose mistakes used to print part of a secret,
and the Java reading rules the files must follow (line breaks, ISO-8859-1, trimmed values,
JAAS escapes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from topics.client_security import (
    SCRAM_LOGIN_MODULE,
    ClientPropertyError,
    format_properties,
    jaas_login,
    parse_jaas_login,
    parse_properties,
    read_properties_file,
    to_librdkafka,
)

KEY_LINE = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
PEM_WITHOUT_CONTINUATIONS = (
    "security.protocol=SSL\n"
    "ssl.keystore.type=PEM\n"
    "ssl.keystore.certificate.chain=cert\n"
    "ssl.keystore.key=-----BEGIN PRIVATE KEY-----\n"
    f"{KEY_LINE}\n"
    "-----END PRIVATE KEY-----\n"
)


def test_a_pem_key_pasted_without_continuations_names_the_line_not_the_key(
    tmp_path: Path,
) -> None:
    path = tmp_path / "client.properties"
    path.write_text(PEM_WITHOUT_CONTINUATIONS, encoding="utf-8")
    with pytest.raises(ClientPropertyError) as err:
        to_librdkafka(read_properties_file(path), source=str(path))
    message = str(err.value)
    assert KEY_LINE not in message and "PRIVATE" not in message
    assert f"line 5 of {path}" in message
    with pytest.raises(ClientPropertyError) as err:
        to_librdkafka(parse_properties(PEM_WITHOUT_CONTINUATIONS))
    assert KEY_LINE not in str(err.value) and "line 5" in str(err.value)


@pytest.mark.parametrize(
    "brk", ["\x85", "\u2028", "\u2029", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"]
)
def test_only_javas_line_breaks_end_a_line(brk: str) -> None:
    props = parse_properties(f"sasl.password=ab{brk}cd\nsecurity.protocol=SASL_SSL\r\nx.y=1\r")
    assert props == {"sasl.password": f"ab{brk}cd", "security.protocol": "SASL_SSL", "x.y": "1"}
    settings = to_librdkafka({"sasl.password": props["sasl.password"], "sasl.username": "u"})
    assert settings["sasl.password"] == f"ab{brk}cd"


def test_an_unknown_key_that_is_no_property_name_is_not_printed() -> None:
    for key in ("cd", "Secret.Tail", "a" * 70 + ".b", "x/y.z"):
        with pytest.raises(ClientPropertyError) as err:
            to_librdkafka(parse_properties(f"security.protocol=SSL\n{key}=1\n"), source="f")
        assert key not in str(err.value) and "line 2 of f" in str(err.value)
    with pytest.raises(ClientPropertyError, match=r"'foo\.bar'"):
        to_librdkafka({"foo.bar": "1"})


def test_an_unquoted_password_with_a_blank_never_prints_its_tail() -> None:
    jaas = f"{SCRAM_LOGIN_MODULE} required username=alice\n password=hunter2 top=secret;"
    with pytest.raises(ClientPropertyError) as err:
        to_librdkafka({"sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas})
    message = str(err.value)
    assert "top" not in message and "secret" not in message and "hunter2" not in message
    assert "line 2 of the JAAS config" in message
    with pytest.raises(ClientPropertyError) as err:
        parse_jaas_login(f"{SCRAM_LOGIN_MODULE} required password=hunter2 top=;")
    assert "top" not in str(err.value) and "line 1 of the JAAS config" in str(err.value)
    # Before the password, the option is named as before.
    with pytest.raises(ClientPropertyError, match="'extra'"):
        to_librdkafka(
            {
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.jaas.config": f"{SCRAM_LOGIN_MODULE} required extra=1 username=a password=p;",
            }
        )


def test_formatted_properties_are_ascii_with_unicode_escapes() -> None:
    props = {"sasl.password": "pä\u00a0ss😀\x0b\u2028 x", "client.id": "naïve"}
    text = format_properties(props)
    assert text.isascii()
    assert "p\\u00e4\\u00a0ss\\ud83d\\ude00\\u000b\\u2028 x" in text
    assert parse_properties(text) == props
    # What Java's Properties.load(InputStream) sees: the bytes as ISO-8859-1.
    assert parse_properties(text.encode("ascii").decode("iso-8859-1")) == props


def test_string_values_are_trimmed_as_java_does_but_not_secrets() -> None:
    settings = to_librdkafka(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512 ",
            "client.id": " bridge\t",
            "sasl.jaas.config": f'{SCRAM_LOGIN_MODULE} required username="u" password=" p ";',
            "ssl.truststore.type": "PEM ",
            "ssl.truststore.location": "/etc/ca.pem ",
        }
    )
    assert settings["sasl.mechanism"] == "SCRAM-SHA-512"
    assert settings["client.id"] == "bridge"
    assert settings["sasl.password"] == " p "
    assert settings["ssl.ca.location"] == "/etc/ca.pem"
    assert to_librdkafka({"sasl.username": "u", "sasl.password": " p "})["sasl.password"] == " p "


def test_quoted_jaas_escapes_read_as_javas_tokenizer_does() -> None:
    jaas = f'{SCRAM_LOGIN_MODULE} required username="a\\tb" password="x\\ny\\\\z\\"\\101\\q";'
    _, options = parse_jaas_login(jaas)
    assert options == {"username": "a\tb", "password": 'x\ny\\z"Aq'}
    for password in ("tab\there", "two\nlines\r\n", 'q"uote\\'):
        login = jaas_login(SCRAM_LOGIN_MODULE, "u", password)
        assert "\n" not in login and "\r" not in login
        assert parse_jaas_login(login)[1]["password"] == password
