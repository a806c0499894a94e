import unittest
from solution import reverse_words

class T(unittest.TestCase):
    def test_basic(self):
        self.assertEqual(reverse_words("the sky is blue"), "blue is sky the")

    def test_spaces(self):
        self.assertEqual(reverse_words("  hello   world  "), "world hello")

    def test_empty(self):
        self.assertEqual(reverse_words(""), "")
