"""loom.sensitivity in each language of its lexicon (loom/sensitivity_words.json).

Per language: a password or PIN stated with its value after the noun (with or without a
colon) and, where the language says so, before it; prose that only mentions the words; and
template values made of the language's placeholder words. Every value below is made up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from loom.sensitivity import high_reasons, reads_as_high
from loom.sensitivity_words import PATH, WORDS, load

PW = "password_assignment"
PIN = "pin"


@dataclass(frozen=True)
class Cases:
    stated: tuple[tuple[str, str], ...]  # (text, the reason it must give)
    mentions: tuple[str, ...]
    placeholders: tuple[str, ...]


CASES: dict[str, Cases] = {
    "en": Cases(
        stated=(
            ("the wifi password is Kq7#mZ2p", PW),
            ("Kq7#mZ2p is my password, don't share it", PW),
            ("use Kq7#mZ2p as the password", PW),
            ("I changed the password to Lantern!42", PW),
            ("4821 is my PIN", PIN),
            ("alarm code 7391", PIN),
            ("credentials: admin / S3cret!pw", PW),
            ("login/pw = root / Xq9pw2a!", PW),
        ),
        mentions=(
            "forgot your password? click the link",
            "1234 is a terrible PIN",
            "The default PIN is 0000, change it after setup.",
            "Bitwarden is my password manager.",
            "What is my password?",
            "credentials: see the 1Password vault",
        ),
        placeholders=("password: your_password_here", "PASSWORD=<your-password>"),
    ),
    "de": Cases(
        stated=(
            ("Mein Passwort ist Sommer2024!", PW),
            ("das Passwort lautet: kX9mP2qL", PW),
            ("Passwort Sommer2024", PW),
            ("Sommer2024! ist mein Passwort", PW),
            ("Das Passwort ist übrigens Regen#Schirm42", PW),
            ("Ich hab das Passwort geändert, es ist jetzt Regen#Schirm42", PW),
            ("Meine PIN ist 4821", PIN),
            ("4821 ist meine PIN", PIN),
            ("Zugangscode: 7734", PIN),
            ("Die Alarmanlage hat den Code 7391.", PIN),
            ("Zugangsdaten: admin / Sommer2024!", PW),
            ("WLAN-Schlüssel: K9xmP2qL7v", PW),
        ),
        mentions=(
            "Passwort vergessen? Hier klicken",
            "Seit 2020 ist das Passwort alle 90 Tage zu ändern.",
            "Mit Windows11 ist das Passwort optional.",
            "Ihre PIN besteht aus 4 Ziffern.",
            "Der Code ist 2023 entstanden.",
            "Zugangsdaten: bekommst du per Signal",
            "WLAN: FritzBox-7530, Kanal 11",
        ),
        placeholders=("Passwort: dein-passwort", "password = ihr_passwort_hier", "PASSWORT=<dein Passwort>"),
    ),
    "nl": Cases(
        stated=(
            ("Mijn wachtwoord is Zomer2024!", PW),
            ("wachtwoord: fiets123", PW),
            ("het wifi wachtwoord is trouwens bitterbal99", PW),
            ("Zomer2024! is mijn wachtwoord", PW),
            ("Ik heb het wachtwoord veranderd naar Tulpen!2025", PW),
            ("mijn pincode is 4821", PIN),
            ("4821 is mijn pincode", PIN),
            ("De deurcode is 0718", PIN),
            ("inloggegevens: pieter / Gouda_kaas7", PW),
        ),
        mentions=(
            "vergeten wachtwoord? klik op de link",
            "In 2019 was het wachtwoord nog maar 6 tekens.",
            "Het wachtwoord is hoofdlettergevoelig.",
            "De postcode is 1012 AB Amsterdam.",
        ),
        placeholders=("wachtwoord: jouw_wachtwoord", "PASSWORD=jouw-wachtwoord-hier"),
    ),
    "fr": Cases(
        stated=(
            ("Mon mot de passe est Ete2024!", PW),
            ("mot de passe : kX9mP2qL", PW),
            ("mdp: kX9mP2qL", PW),
            ("Ete2024! c'est mon mot de passe", PW),
            ("Le mot de passe de la box, c'est «182585»", PW),
            ("mon code PIN est 8642", PIN),
            ("4821 c'est mon code PIN", PIN),
            ("Digicode : 4729", PIN),
            ("Identifiants : jdupont / Soleil#2023", PW),
            ("la clé WiFi est K9x!mP2q", PW),
        ),
        mentions=(
            "Mot de passe oublié ? Cliquez sur le lien.",
            "Le mot de passe doit contenir 12 caractères.",
            "Le code postal est 75011.",
            "Votre code de confirmation : 551203",
        ),
        placeholders=("mot de passe: votre_mot_de_passe", "password = VOTRE_MOT_DE_PASSE_ICI"),
    ),
    "es": Cases(
        stated=(
            ("Mi contraseña es Verano2024!", PW),
            ("contraseña: Verano2024", PW),
            ("Verano2024! es mi contraseña", PW),
            ("la clave del router es Casa#2021", PW),
            ("mi PIN es 2468", PIN),
            ("4821 es mi PIN", PIN),
            ("el código de la puerta es 5521", PIN),
            ("usuario y contraseña: admin / Verano2024!", PW),
        ),
        mentions=(
            "cambia tu contraseña cada 90 días",
            "¿Cuál es la contraseña del wifi? No la encuentro.",
            "La contraseña debe tener al menos 8 caracteres.",
            "El PIN por defecto es 0000; cámbialo.",
        ),
        placeholders=(
            "password: tu_contraseña_aquí",
            "contraseña=<tu contraseña>",
            "clave: mi_clave_secreta",
        ),
    ),
    "pt": Cases(
        stated=(
            ("A minha senha é Verao2024!", PW),
            ("senha: kX9mP2qL", PW),
            ("palavra-passe: kX9mP2qL", PW),
            ("Verao2024! é a minha senha", PW),
            ("o meu PIN é 9323", PIN),
            ("4821 é o meu PIN", PIN),
            ("o código do cadeado é 3090", PIN),
            ("credenciais: mariana / Ipanema!88", PW),
        ),
        mentions=(
            "Esqueceu a senha? Clique aqui.",
            "A senha expira em 90 dias.",
            "Qual é a senha do wifi?",
            "o código é 2024, não mudou",
        ),
        placeholders=("senha: sua_senha_aqui", "SENHA=sua-senha"),
    ),
    "it": Cases(
        stated=(
            ("La mia password è Estate2024!", PW),
            ("La password del wifi è MareBlu_2019", PW),
            ("Estate2024! è la mia password", PW),
            ("il mio PIN è 5926", PIN),
            ("4821 è il mio PIN", PIN),
            ("Il codice della cassaforte è 90713", PIN),
            ("credenziali: m.rossi / Tiramisu!9", PW),
        ),
        mentions=(
            "Hai dimenticato la password? Reimpostala qui.",
            "Il PIN è personale, non comunicarlo.",
            "Il codice è su GitHub da marzo 2024.",
        ),
        placeholders=("password: la_tua_password", "password = tua-password-qui"),
    ),
    "sv": Cases(
        stated=(("lösenord: Sommar2024!", PW), ("min PIN-kod är 9502", PIN)),
        mentions=("Glömt ditt lösenord? Klicka här.",),
        placeholders=("lösenord: ditt_lösenord",),
    ),
    "pl": Cases(
        stated=(("hasło: Lato2024!", PW), ("mój PIN to 8841", PIN)),
        mentions=("Nie pamiętasz hasła? Kliknij tutaj.",),
        placeholders=("hasło: twoje_hasło_tutaj",),
    ),
    "fi": Cases(
        stated=(("salasana: Kesa2024!", PW),),
        mentions=("Unohditko salasanan? Napsauta tästä.",),
        placeholders=("salasana: sinun_salasana",),
    ),
}


def test_every_language_of_the_lexicon_has_cases() -> None:
    assert set(CASES) == set(WORDS.languages)


@pytest.mark.parametrize("language", sorted(CASES))
def test_stated_secrets_read_as_high(language: str) -> None:
    wrong = [
        (text, high_reasons(text))
        for text, reason in CASES[language].stated
        if reason not in high_reasons(text)
    ]
    assert wrong == []


@pytest.mark.parametrize("language", sorted(CASES))
def test_mentions_and_placeholders_do_not(language: str) -> None:
    cases = CASES[language]
    flagged = [
        (text, high_reasons(text)) for text in (*cases.mentions, *cases.placeholders) if reads_as_high(text)
    ]
    assert flagged == []


# --------------------------------------------------------------------------- the lexicon file


def _write(tmp_path: Path, edit: dict[str, object]) -> Path:
    raw = json.loads(PATH.read_text(encoding="utf-8"))
    for dotted, value in edit.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    path = tmp_path / "words.json"
    path.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"languages.de.pin": None}, "language 'de' lacks ['pin']"),
        ({"languages.fr.password": ["Mot de passe"]}, "fr.password must hold non-empty lower-case strings"),
        (
            {"credential_calls.login": {"2": 2}},
            "credential_calls.login must map an argument count to an index",
        ),
    ],
)
def test_a_malformed_lexicon_is_refused_with_the_field_named(
    tmp_path: Path, edit: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(_write(tmp_path, edit))


def test_the_lexicon_ships_with_the_package() -> None:
    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert PATH.name in pyproject  # package-data, so an installed Loom finds it beside the module
    assert load().languages.keys() == WORDS.languages.keys()
