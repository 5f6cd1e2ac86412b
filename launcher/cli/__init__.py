"""The command line: the only place that sees argparse. Each command module turns its options into
typed values and calls the stages below; errors become exit codes in main.py.
"""
