from collections import Counter

def top_words(text, k):
    counts = Counter(w.lower() for w in text.split())
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
