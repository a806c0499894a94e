from collections import Counter

def top_words(text, k):
    counts = Counter(text.split())
    return counts.most_common(k)
