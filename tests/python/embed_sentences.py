"""The fixed sentences of the embedding parity checks (tests/python/embed_parity_test.py on the
CPU, gpu/embed_bench.py on the GPU): empty and blank strings, inputs past the 256-token limit,
many scripts, emoji, combining marks, code, numbers."""

_LOREM = ("the quick brown fox jumps over the lazy dog while seven wizards quietly judge "
          "boxing matches in a distant valley near the river bank ").split()
_RU = "Съешь же ещё этих мягких французских булок да выпей чаю".split()
_ZH = "我们在山上看日出然后一起吃早饭"

SENTENCES = [
    # Edge cases of size and whitespace.
    "",
    " ",
    "   \t\n  ",
    "a",
    "?",
    "I",
    "Hello world",
    "hello world",
    "HELLO WORLD!!!",
    "The cat sat on the mat.",
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "Machine learning models map sentences to dense vectors that capture their meaning.",
    # Long inputs, well past the 256-token limit.
    " ".join(_LOREM[i % len(_LOREM)] for i in range(420)),
    " ".join(f"word{i}" for i in range(450)),
    " ".join(_RU[i % len(_RU)] for i in range(500)),
    "。".join(_ZH for _ in range(40)),
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 60,
    " ".join(["supercalifragilisticexpialidocious"] * 300),
    # Scripts.
    "我爱自然语言处理。",
    "今天天气很好，我们去公园散步吧。",
    "東京は日本の首都です。",
    "ひらがなとカタカナと漢字が混ざった文章です。",
    "한국어 문장을 임베딩합니다.",
    "서울은 대한민국의 수도입니다.",
    "مرحبا بالعالم، هذه جملة باللغة العربية.",
    "שלום עולם, זה משפט בעברית.",
    "Привет, мир! Это предложение на русском языке.",
    "Γειά σου κόσμε, αυτή είναι μια ελληνική πρόταση.",
    "नमस्ते दुनिया, यह एक हिंदी वाक्य है।",
    "สวัสดีชาวโลก นี่คือประโยคภาษาไทย",
    "Xin chào thế giới, đây là một câu tiếng Việt.",
    "Türkçe bir cümle: İstanbul'da ılık bir gün.",
    "Straße, Größe, Fußgänger und Übermut.",
    # Emoji: plain, skin tones, ZWJ sequences, flags, keycaps.
    "😀",
    "I love pizza 🍕🍕🍕 and 🎉 parties!",
    "👍🏽 thumbs up with a skin tone",
    "family: 👨‍👩‍👧‍👦 and a technologist 👩🏿‍💻",
    "🏳️‍🌈 🏴‍☠️ ❤️‍🔥",
    "flags 🇯🇵 🇺🇸 🇫🇷 🇧🇷 🇮🇳",
    "keycaps 1️⃣ 2️⃣ #️⃣",
    # Combining accents and normalization forms.
    "cafe\u0301 vs café",
    "e\u0301e\u0300e\u0302e\u0308 n\u0303",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349a\u0300\u0310l\u0357g\u0312o\u0344",
    "ﬁne ligatures and ｆｕｌｌｗｉｄｔｈ letters",
    # Mixed scripts.
    "English, 中文, 日本語, 한국어, русский, العربية in one line",
    "The word 'Zeitgeist' (时代精神) is German.",
    "iPhone 15 Pro Max の価格は¥159,800です",
    # Code.
    "def f(x):\n    return x * 2 if x > 0 else -x",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "<div class=\"x\"><span>hi</span></div>",
    # Numbers, URLs, addresses.
    "3.14159 2.71828 1.41421 1e-12 -0.0 +inf NaN",
    "Call +1 (555) 123-4567 or email john.doe@example.com",
    "https://example.com/path/to/page?query=1&lang=en#section-2",
    "2024-02-29T23:59:59Z 192.168.0.1 0xDEADBEEF",
    "1234567890" * 20,
    # Punctuation and long words.
    "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
    "... --- ... ??? ;;; ::: ,,, ''' \"\"\" ```",
    "(((((nested))))) [[[[brackets]]]] {{{{braces}}}}",
    "a" * 1000,
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 12,
    # Control and odd characters.
    "tab\tseparated\tvalues\tand\nnew\nlines",
    "zero\u200bwidth\u200cjoiners\u200dhere and a soft\u00adhyphen",
    "right-to-left \u202eoverride\u202c and BOM \ufeff inside",
]
