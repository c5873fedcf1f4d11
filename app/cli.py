def main():
    print("docqa")
